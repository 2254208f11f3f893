// The planner's cost model and search: memory per GPU by category, step time from GEMM
// shapes, HBM traffic, alpha-beta collectives on the node/cluster hierarchy and the replayed
// pipeline schedule; the search over every valid layout. Formulas and sources:
// docs/planner.md.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "plan/hardware.h"
#include "plan/models.h"
#include "plan/pipeline.h"

namespace mt::plan {

struct Layout {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  // How the cp ranks get the keys and values (train --cp-comm, docs/context_parallel.md):
  // "ring" (point-to-point, overlapped with the attention), "all-gather" (gathered per layer,
  // dK|dV reduce-scattered; not overlapped) or "a2a" (Ulysses: all-to-alls that turn the
  // sequence split into a head split; not overlapped).
  std::string cp_comm = "ring";
  // Expert parallelism, carved from dp × cp (Megatron-Core's parallel folding; not a factor
  // of the GPU count): a MoE block's routed experts are split over ep ranks, their gradients
  // reduced over expert-dp = dp·cp / ep, the dense parameters' over dp × cp (plan/moe.h).
  int ep = 1;
  // Expert tensor parallelism (Megatron-Core's expert_tensor_parallel_size): how many of a
  // rank's tp ranks split each routed expert, 1 or tp; 0 is the software's own (Megatron-Core:
  // tp; our runtime: 1, experts whole). With 1 under Megatron-Core a tp group's ranks hold the
  // same experts, so the experts' gradients reduce over tp·dp·cp / ep ranks (plan/moe.h).
  int etp = 0;
  int virtual_stages = 1;
  int64_t microbatch = 1;
  int zero = 0;
  Recompute recompute = Recompute::kNone;
  bool sp = false;
  std::string schedule = "1f1b";  // gpipe, 1f1b, interleaved
  // Gradient reduction overlapped with the last backward (PyTorch DDP, our runtime); false:
  // after backward (Megatron-LM 2021's "local" DDP).
  bool dp_overlap = true;
  // Backward's TP collectives of the column-parallel linears (qkv, MLP in) run while the same
  // linear's weight gradient computes (Megatron-LM since 2022, Korthikanti et al.); false:
  // after it (Megatron-LM 2021).
  bool tp_overlap = true;
  // Every TP collective (SP's all-gathers and reduce-scatters, forward and backward) runs
  // while the GEMM beside it computes, in chunks (Transformer Engine's userbuffers,
  // Megatron-Core's `--tp-comm-overlap`; NVLink only): opt-in, as it is there.
  bool tp_comm_overlap = false;
  // Interleaved pipelines: the p2p transfers run on their own stream while the next chunk
  // computes (Megatron-Core's overlap_p2p_comm, on by default for interleaving); false: a
  // blocking exchange that costs the rank its time (Megatron-LM 2021/2022).
  bool pp_overlap = true;
  // Mixed precision: attention as one fused kernel (FlashAttention / cuDNN through
  // Transformer Engine, as today's Megatron-Core runs it, dropout included): no T×T scores
  // through HBM nor kept for backward. false: the unfused scale-mask-softmax (+ dropout)
  // kernels and stored probabilities of Megatron-LM 2021/2022 (Korthikanti et al.'s 5as²b,
  // the reason for their selective recomputation). Our f32 CPU runtime is unfused.
  bool fused_attention = true;
  // Mixed precision: Megatron-Core's fused vocabulary-parallel cross-entropy (NeMo's
  // cross_entropy_loss_fusion, on by default): the casts, maximum, exp-sum and normalisation
  // in three kernels over the f32 copy of the logits. false: Megatron-LM 2021/2022's
  // `vocab_parallel_cross_entropy(output.float())`, each step its own kernel (kernels.cpp).
  bool fused_cross_entropy = true;
  // Mixed precision, SwiGLU: Megatron-Core's fused SwiGLU (bias_swiglu_impl, on with
  // bias_activation_fusion, as NeMo's Llama recipes run it) keeps only its input for backward;
  // false: `silu(gate) * up` in eager PyTorch also keeps silu(gate), 2 bytes more per element
  // of the hidden width.
  bool fused_swiglu = true;
  // The weight-gradient GEMMs accumulate into the gradient buffer (Megatron-LM's gradient
  // accumulation fusion, Transformer Engine's fuse_wgrad_accumulation; our runtime's GEMMs
  // with beta = 1). false (Megatron-LM 2021): each backward writes a temporary weight
  // gradient that a separate elementwise add folds into the buffer (`main_grad.add_(grad)`,
  // or autograd's accumulation into .grad under torch DDP): per parameter and microbatch,
  // one read of the temporary and a read and a write of the buffer.
  bool grad_accum_fusion = true;
  // The gradients accumulate in autograd's .grad, in the parameters' dtype (torch DDP, which
  // Megatron-LM 2021/2022 used without pipelining): unfused, the first microbatch's gradient
  // becomes .grad as it is and each later one is added in that dtype. false: a main_grad
  // buffer (Megatron's own DDP, Megatron-Core), zeroed each step, that every microbatch adds
  // into in the gradients' dtype.
  bool torch_ddp = false;
  // ZeRO-3's collectives per GPU: 0, NCCL's bound on the node/cluster hierarchy
  // (hier_collective); else the bytes a rank receives (or sends) at this rate whatever the
  // link (kDeepSpeed2021Zero3BytesPerS).
  double z3_bytes_per_s = 0;
  // Under full recomputation the recompute's forward gathers a module's parameters again
  // unless their next use (that module's backward) is fewer than this many parameters away
  // (DeepSpeed's stage3_max_reuse_distance; 0: never gathered again, FSDP and ours, whose
  // backward gathers a block once for its recompute and its backward). The parameters used
  // in between are the later modules' of the block, recomputed and then back-propagated:
  // regathered_fraction below.
  double z3_max_reuse_distance = 0;
  // ZeRO-3's gathers prefetched one module (Linear) ahead, each beside the compute between
  // two modules' hooks (DeepSpeed: fetch_sub_module, then prefetch_next_sub_modules, then
  // the module; module_walk in planner.cpp). false: one block ahead (FSDP's units), where
  // a block's compute and the next block's gather are each uniform: the pass takes the
  // longer of its compute and its collectives.
  bool z3_module_prefetch = false;
  // Layers per pipeline chunk (pp·v entries in model order), as `train --pp-layers` gives
  // them. Empty: the split the run makes — our runtime's cost-balanced one
  // (parallel/pipeline/partition.h: the LM head's chunk takes fewer layers), or with
  // even_layers Megatron-LM's n_layer / (pp·v) each (which it requires to divide).
  std::vector<int> pp_layers;
  bool even_layers = false;
  // tp placed across nodes (hosts): train's `--mesh-order pp,tp,cp,dp`, where dp (then cp)
  // fills a node first and a tp group's ranks are dp·cp apart. Its collectives then cross the
  // inter-node link (docs/multihost.md); false: tp inside a node, the default order.
  bool tp_across_nodes = false;
};

struct Job {
  ModelSpec model;
  ClusterSpec cluster;
  int64_t gpus = 1;
  int64_t batch = 1;  // global batch, sequences
  int64_t seq = 0;
  std::string dtype = "bf16";  // bf16 / fp16 (mixed precision), f32 (our CPU runtime)
  // Run by `meshtrain train` (plan --emit-config) rather than Megatron-LM, whose executor
  // mixed precision models otherwise: see runs_our_runtime.
  bool our_runtime = false;
  // MoE: the busiest expert's load over the mean (1: perfectly balanced). Scales the routed
  // experts' compute and the all-to-all bytes of the busiest ep rank (plan/moe.h).
  double expert_load = 1.0;
};

// Whose executor runs the job: ours for f32, on a shared host (this-host) and for an
// emitted config — no dropout, attention unfused (the CUDA backend's fused kernel is
// opt-in), blocking TP collectives and pipeline exchanges, a spare activation set per
// pipeline rank and no separate p2p buffers; Megatron-LM's otherwise (as_run).
bool runs_our_runtime(const Job& j);
// On a host whose cores the ranks share (ClusterSpec::compute_units > 0): the most of it one
// rank can use (its threads: the trainer gives each max(1, cores / N)), and its share while
// every rank computes (1/N, less where N does not divide the cores). 1 on GPUs.
double rank_cap(const Job& j);
double per_rank_share(const Job& j);

// train's --attention auto on the CPU: the blockwise kernel from this sequence length on
// (train/trainer.h kCpuFlashMinSeq; plan/ does not include train/, and
// tests/plan/context_parallel_test.cpp checks that the two agree).
inline constexpr int64_t kOurCpuFlashMinSeq = 1024;

// Whether our runtime runs this layout's attention on the blockwise (flash-style) CPU
// kernel: always with cp > 1 (its pieces), else on a shared host from kOurCpuFlashMinSeq
// unless the layout asks for the unfused kernel (train --attention naive). Its attention then
// keeps one log-sum-exp per row and head instead of the T x T probabilities.
bool runs_our_flash(const Job& j, const Layout& l);

struct MemoryBytes {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, communication = 0;
  // Mixed precision: the fp32 copy of the (local shard's) gradients the optimizer step
  // reads (Megatron-LM's `main_param.grad = main_grad.float()`, DeepSpeed's fp32 partition
  // gradient). It exists only at the step, after backward freed the activations and the
  // p2p buffers, so the peak is the larger of the two phases (docs/planner.md).
  double step_gradients_f32 = 0;
  double states() const { return parameters + gradients + optimizer; }
  double total() const {
    return states() + std::max(activations + communication, step_gradients_f32);
  }
};

struct Estimate {
  Layout layout;
  int64_t microbatches = 0;  // per pipeline per step
  MemoryBytes memory;        // worst rank
  int worst_stage = 0;
  int in_flight = 0;  // microbatch-chunks held by the worst stage (from the schedule)
  // bubble_fraction: the pipeline's idle time beyond the busiest rank's compute, over the
  // step; with blocking p2p (replay_rendezvous) that includes the exchanges' transfers.
  double step_time_s = 0, tokens_per_s = 0, tflops_per_gpu = 0, hw_tflops_per_gpu = 0, mfu = 0,
         bubble_fraction = 0;
  // Where the time goes (seconds per step) on the busiest rank: the one with the most compute
  // in the replay (the rank bubble_fraction measures against). forward_s and backward_s are
  // its forward and backward actions (embedding, LM head, recomputation, unfused gradient
  // adds and weight gradients included); tp_comm_s and cp_comm_s the exposed collectives of
  // its layers.
  // cp_comm_s: ring attention's transfers not hidden behind the attention compute.
  // grad_accum_s: the busiest rank's unfused gradient accumulation adds
  // (Layout::grad_accum_fusion off; inside its backward actions).
  // embedding_sync_s: the tied embedding's gradient summed by the first and the last stage
  // after the flush (pipelines only; part of the step, not hidden).
  double pipeline_s = 0, forward_s = 0, backward_s = 0, tp_comm_s = 0, cp_comm_s = 0, pp_comm_s = 0,
         dp_comm_s = 0, dp_exposed_s = 0, optimizer_s = 0, grad_accum_s = 0, embedding_sync_s = 0;
  // tp_vocab_s: the busiest rank's vocabulary-parallel collectives (the embedding's output
  // and the LM head's input gradient summed over tp, the cross-entropy's per-token sums).
  double tp_vocab_s = 0;
  // ep_comm_s: the busiest rank's MoE all-to-alls (dispatch + combine, forward and backward;
  // not overlapped).
  double ep_comm_s = 0;
  // moe_tp_comm_s: the busiest rank's expert-tp collectives (Megatron-Core: the routed rows
  // all-gathered over tp before the experts, their outputs reduce-scattered after; forward
  // and backward; not overlapped; plan/moe.h moe_expert_tp).
  double moe_tp_comm_s = 0;
  // One block's forward and backward (+ recomputation) for one microbatch, exposed TP and CP
  // communication included: what Korthikanti et al. 2022 Table 4 measures per layer.
  double layer_forward_s = 0, layer_backward_s = 0;
  int busiest_rank = 0;  // pipeline rank
  ReplayResult replay;   // spans kept when asked
};

// The layout as the job runs it, what estimate() costs and reports. Without a pipeline
// (pp 1) train accumulates the microbatches one after another whatever --schedule says:
// "1f1b" (one microbatch's activations held; a zb1 pin does not split the backward;
// interleaved is left for invalid_reason to refuse). The software switches as they take
// effect: no overlap on a shared host, none of TP or the pipeline's and no fused attention
// in our runtime (runs_our_runtime), TP overlap only with tp > 1 and not under zb1 (whose
// weight gradients run later), p2p overlap only in an interleaved pipeline.
Layout as_run(const Job& j, Layout l);

// The memory a rank may use: its GPU's, or its share of a shared host's (ClusterSpec::for_job).
inline double memory_per_rank(const Job& j) { return j.cluster.for_job(j.gpus).gpu.hbm_bytes; }

// The most microbatches per step and pipeline a layout may have: the replay walks every one
// (a batch of millions of sequences, say a token count given as --batch, would take minutes
// and gigabytes to plan; no real job accumulates that many).
inline constexpr int64_t kMaxMicrobatches = 16384;

// Refuses a layout that cannot run, with the reason (divisibility, T beyond a node, ...);
// `kind`, when given, gets the reason's kind: a fixed text, without the layout's numbers,
// that the search counts its drops under (SearchResult::dropped).
std::optional<std::string> invalid_reason(const Job& job, const Layout& l,
                                          std::string* kind = nullptr);
MemoryBytes memory_per_gpu(const Job& job, const Layout& l, int* worst_stage = nullptr,
                           int* in_flight = nullptr);
// The same, with the per-rank microbatch-chunks in flight of the layout's schedule given,
// and what they are chunk by chunk at the ranks' peaks (plan/pipeline.h chunk_flight; without
// it each microbatch-chunk counts as the rank's largest chunk, an upper bound).
struct ChunkFlight;
MemoryBytes memory_with_flight(const Job& job, const Layout& l, const std::vector<int>& flight,
                               int* worst_stage = nullptr, int* in_flight = nullptr,
                               const ChunkFlight* chunks = nullptr);
// Every pipeline stage's memory per rank (index: pipeline rank; memory_per_gpu is the
// largest), e.g. to add up the ranks that share a host (train's up-front memory check).
std::vector<MemoryBytes> memory_by_stage(const Job& job, const Layout& l);
// The same, with the per-rank microbatch-chunks in flight given (memory_with_flight's).
std::vector<MemoryBytes> stage_memory(const Job& job, const Layout& l,
                                      const std::vector<int>& flight,
                                      const ChunkFlight* chunks = nullptr);
// Which software runs the layout, for what it overlaps and fuses (docs/planner.md,
// "Software"): Megatron-LM as Narayanan et al. ran it in 2021; as Korthikanti et al. ran it
// in 2022 (backward's TP all-reduces beside the weight gradients, otherwise 2021's); today's
// (Megatron-Core with Transformer Engine, and ours): the DP reduction overlapped, fused
// attention, p2p on its own stream, the layers balanced by cost.
// kDeepSpeed2021: DeepSpeed's ZeRO-3 as Narayanan et al. 2021 (Table 2) compared with it, on
// 2021's Megatron-LM model code: kMegatron2021's switches, with ZeRO-3's collectives at the
// rate its gathers achieved (z3_bytes_per_s) and its regathering under recomputation
// (z3_max_reuse_distance). Its gathers overlap the compute one module deep, as every
// ZeRO-3's: fetch_sub_module waits for the module's own parameters, then
// prefetch_next_sub_modules starts the next module's all_gather, then the module computes
// (stage3.py of spring 2021; the torch.cuda.synchronize() before each all_gather, PR #1188's
// "the async version is not async at all", blocks the host until the GPU is idle, which it is
// by then, not the gather's overlap with the compute queued after it).
enum class Software { kMegatron2021, kMegatron2022, kToday, kDeepSpeed2021 };
// The rate DeepSpeed's ZeRO-3 gathered parameters at before its PR #1188 (2021-06), per GPU:
// bing_bert of 5.1B parameters (hidden 2560, 64 layers; fp16: 10.2 GB) on 8 A100s with NVLink
// (one p4d.24xlarge) took 470 ms per forward under ZeRO-3 (the PR's "before") against 60 ms
// under ZeRO-2 (DeepSpeed issue #1174). Its gathers far outlast its compute, so with the
// compute beside them the forward is the gathers: each GPU received 7/8 of 10.2 GB in 0.47 s,
// 19.0 GB/s, a tenth of NVLink's (its synchronisation and copies, not the link, bound it).
// The only published measurement of that code at hand; not fitted to any run the planner is
// tested on. (Until 2026-11-29: 21.8 GB/s, 0.41 s, read with the compute added to the gathers.)
inline constexpr double kDeepSpeed2021Zero3BytesPerS = 7.0 / 8 * 10.2e9 / 0.47;
// stage3_max_reuse_distance's default in DeepSpeed's ZeRO-3 configuration (1e9 parameters;
// PrefetchCoordinator.get_reuse_distance_in_numel counts the parameters of the modules
// between two uses of a module in the recorded forward + backward trace).
inline constexpr double kDeepSpeed2021MaxReuseDistance = 1e9;
// Under full recomputation with ZeRO-3, the fraction of a block's parameters (per TP rank)
// that the recompute's forward gathers a second time in backward (Layout::
// z3_max_reuse_distance): a module's parameters stay gathered for its backward only if the
// parameters used in between — the block's later modules, recomputed and then
// back-propagated — number fewer than that distance. The modules in forward order are QKV,
// the attention projection, MLP in (gate and up fused) and MLP out, as Megatron-LM's
// Linear layers; the norms and biases are too small to partition (DeepSpeed's
// param_persistence_threshold, 1e5) and are left out. 0 when the distance is 0 (FSDP, ours).
double regathered_fraction(const Job& j, const Layout& l);
// A block's four weight matrices in the order they run — QKV, the attention projection, MLP
// in, MLP out — with their parameters per TP rank, and whether the recompute's forward
// gathers each again for its backward (regathered_fraction's rule).
struct Z3Modules {
  double params[4] = {};
  bool regathered[4] = {};
};
Z3Modules z3_modules(const Job& j, const Layout& l);
// Sets Layout's dp_overlap, tp_overlap, pp_overlap, fused_attention, fused_cross_entropy,
// fused_swiglu, grad_accum_fusion,
// torch_ddp, even_layers, z3_bytes_per_s, z3_max_reuse_distance and z3_module_prefetch as
// that software has them
// (tp_comm_overlap, opt-in everywhere, is left as it is). Set after l.pp.
void set_software(Layout& l, Software s);
inline void set_software(Layout& l, bool megatron_2021) {
  set_software(l, megatron_2021 ? Software::kMegatron2021 : Software::kToday);
}
// Layers of each pipeline chunk (pp·v, model order) as the layout's run splits them.
std::vector<int> chunk_layers(const Job& job, const Layout& l);
// Full estimate (memory and time); keep_spans keeps the per-rank timeline.
Estimate estimate(const Job& job, const Layout& l, bool keep_spans = false);

// Model-state bytes per GPU of Ψ parameters on D data-parallel ranks (ZeRO paper §5:
// mixed precision 2Ψ + 2Ψ + 12Ψ, sharded by stage; bf16 keeps its gradients in fp32: 4Ψ).
MemoryBytes zero_model_states(double psi, int dp, int zero, const std::string& dtype);

struct SearchPins {
  std::optional<int> dp, tp, pp, cp, ep, virtual_stages, zero;
  std::optional<int> etp;  // Layout::etp; unset: the search tries tp and 1 (Megatron-Core MoE)
  std::optional<int64_t> microbatch;
  std::optional<Recompute> recompute;
  std::optional<bool> sp;
  std::optional<std::string> schedule;
  std::string cp_comm = "ring";  // Layout::cp_comm
  // Gradient reduction overlapped with backward (PyTorch DDP) or after it (Megatron's
  // "local" DDP); unset: overlapped (megatron_2021: only without pipelining).
  std::optional<bool> dp_overlap;
  std::optional<bool> tp_overlap;         // unset: overlapped (megatron_2021: not)
  bool tp_comm_overlap = false;           // Layout::tp_comm_overlap on every layout with SP
  std::optional<bool> fused_attention;    // unset: as the software has it
  std::optional<bool> grad_accum_fusion;  // unset: as the software has it
  std::vector<int> pp_layers;             // Layout::pp_layers (only layouts with that many chunks)
  bool tp_across_nodes = false;           // Layout::tp_across_nodes on every layout
  // Only what Megatron-LM could do when Narayanan et al. 2021 ran it (docs/planner.md,
  // "Megatron-LM 2021"): no ZeRO (no distributed optimizer); no sequence parallelism
  // nor selective recomputation (Korthikanti et al. 2022); n_layer divisible by pp; the interleaved
  // schedule only with more than 2 stages ("pipeline-model-parallel size should be greater than 2
  // with interleaved schedule"); the gradient reduction overlapped with backward only without
  // pipelining (torch DDP's no_sync exists only in forward_backward_no_pipelining; with
  // pp > 1 the reduction runs after the flush, DDP=local).
  // Megatron-LM's even split of the layers over the pipeline chunks (Layout::even_layers).
  bool megatron_2021 = false;
};

struct SearchResult {
  std::vector<Estimate> top;                   // best first
  std::map<std::string, int64_t> dropped;      // reason -> count
  std::map<std::string, std::string> example;  // reason -> one example
  int64_t considered = 0, fit = 0, replayed = 0;
  double search_s = 0;
};

SearchResult search(const Job& job, const SearchPins& pins, int top_k);

std::string recompute_name(Recompute r);
Recompute parse_recompute(const std::string& s);

}  // namespace mt::plan
