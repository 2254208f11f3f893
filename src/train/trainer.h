// The training loop, SPMD: run_training launches the ranks (threads of this process with
// the `local` backend, or this process under mpirun) and each runs data -> microbatches ->
// forward/backward (gradients reduced over dp as backward goes) -> clip -> AdamW (on its
// ZeRO shard) -> metrics. Everything a rank allocates is allocated before the first step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "model/config.h"
#include "model/moe.h"
#include "train/optimizer.h"
#include "train/outer_options.h"
#include "train/pipeline_options.h"

namespace mt::train {

struct TrainOptions {
  model::GptConfig model = model::preset("tiny");
  int64_t batch = 16;      // global batch, in sequences (the same whatever the layout)
  int64_t microbatch = 0;  // sequences per forward/backward on a rank; 0 = batch / dp
  int dp = 1;              // data-parallel ranks
  int tp = 1;              // tensor-parallel ranks (world = pp x dp x cp x tp)
  bool sp = false;         // sequence parallelism inside the tp group
  // Context parallelism: every sequence split over cp ranks (parallel/context.h), and how
  // the attention gets the keys and values of the other ranks (docs/context_parallel.md).
  int cp = 1;
  std::string cp_comm = "ring";
  // Expert parallelism: the routed experts of every MoE layer split over ep ranks carved
  // from dp (Megatron-Core's parallel folding: ep divides dp, the world is unchanged; the
  // experts' gradients are reduced over dp / ep, the dense ones over dp; docs/moe.md).
  int ep = 1;
  int zero = 0;                  // ZeRO stage: 0 DDP, 1 optimizer state, 2 + gradients, 3 + params
  double bucket_mb = 25;         // DDP / ZeRO-1 gradient bucket (MiB, PyTorch DDP's default)
  std::string backend = "auto";  // auto (mpi under mpirun, else local), local, mpi, nccl
  double comm_timeout_s = 300;
  int64_t steps = 100;
  float lr = 1e-3f;
  float min_lr_ratio = 0.1f;  // cosine decays to this fraction of lr
  int64_t warmup = -1;        // -1: 5% of the steps
  AdamWConfig adamw;
  float grad_clip = 1.0f;  // 0: off
  // A step whose loss or gradient norm is not finite is skipped (no update), at most this many
  // in a row; one more stops the run (exit 1). 0: stop at the first (train/nonfinite.h).
  int skip_nonfinite = 3;
  uint64_t seed = 1337;
  // Token files: a comma-separated list of paths and globs, read as one stream in order
  // (train/token_corpus.h, docs/data.md).
  std::string data;
  std::string val_data;              // "": hold out the last val_fraction of `data`
  std::string data_format = "auto";  // auto, llmc, nanogpt, megatron (every file of both)
  // Training samples in a seeded permutation per epoch (train/sample_order.h), the same for
  // every layout; false: in file order (llm.c's batches).
  bool shuffle = true;
  double val_fraction = 0.05;
  int64_t eval_every = 0;  // 0: only at the end
  int64_t eval_batches = 4;
  int threads = 0;          // per rank; 0: cores on the host / ranks on the host
  std::string metrics;      // JSON lines, one per step
  std::string tensorboard;  // folder of TensorBoard event files (obs/tensorboard.h), "" none
  std::string export_path;  // safetensors of the final weights
  // Hugging Face weights to start from (a file, or an export folder with config.json): a
  // fine-tuning run; "" trains from the seed's initialisation (train/init_from.h).
  std::string init_from;
  bool profile = false;   // per-kernel time breakdown at the end
  double peak_flops = 0;  // 0: measured GEMM peak (`meshtrain bench peak`)
  // f32, or bf16: mixed precision (f32 master weights, gradients and optimizer state; the
  // weight GEMMs on bf16 operands: docs/mixed_precision.md).
  std::string dtype = "f32";
  // cpu, or cuda: each rank computes on a GPU (rank r on GPU r mod GPUs on its host;
  // docs/cuda.md). Buffers, kernels and the optimizer all live there.
  std::string device = "cpu";
  // The attention kernel: flash (flash-attention style, O(T) memory: on the CPU the blockwise
  // f32 kernel of kernels/flash_attention.h, on a GPU the fused kernel on bf16 tensor cores;
  // `fused` is its other name), naive (GEMMs and a softmax over the T x T probabilities, in
  // f32) or auto: on a GPU fused for bf16 where the kernel has the head dim and sequence
  // length, on the CPU flash from kCpuFlashMinSeq tokens (where it measured at least as fast).
  std::string attention = "auto";
  bool quiet = false;              // no per-step lines (tests)
  bool keep_final_params = false;  // copy the final weights into TrainResult
  PipelineOptions pipeline;        // --pp > 1: train/pipeline_stage.h
  // The mesh's dimensions, slowest to fastest: tp fastest keeps a tp group's ranks on
  // neighbouring ranks (one host under mpirun's default mapping), pp slowest.
  // pp, dp, cp and tp (cp may be left out: it then goes just before tp); ep may be named
  // too (left out: just after dp, so that an ep group is dp's nearest ranks).
  std::string mesh_order = "pp,dp,cp,tp";
  std::string recompute = "none";  // none, selective, full (model/gpt.h Recompute)
  // Mixture of experts: capacity and balancing losses (model/moe.h; docs/moe.md).
  model::MoeOptions moe;
  // Routing replay (model/routing_tape.h; verify sets it, no flag): every MoE layer records
  // its routing decisions into the tape (record_routing) or replays them from it.
  std::shared_ptr<model::RoutingTape> routing_tape;
  bool record_routing = false;
  // DiLoCo: dp split into sites that synchronise every H steps (train/outer_optimizer.h).
  OuterOptions outer;
  // A simulated link between sites (comm::Group::simulate_link; docs/diloco.md "A shaped
  // link"): Mbit/s each way and ms per message on the cross-site groups with --sites, else on
  // the dp gradient group (each dp rank a site of its own). 0: off.
  double sim_link_mbit = 0, sim_link_ms = 0;
  // Checkpoints (train/checkpoint.h, docs/checkpoints.md).
  std::string checkpoint_dir;    // "": none
  int64_t checkpoint_every = 0;  // save every N steps (and after the last); 0: after the last
  int keep_checkpoints = 3;      // the newest K stay; 0: all
  int64_t stop_after = 0;        // save step N and stop there (of the --steps schedule); 0: no
  std::string resume;            // "": no; "auto": newest valid in checkpoint_dir (or scratch)
  int max_restarts = 0;          // local backend: re-run from the newest checkpoint on failure

  int world_size() const { return pipeline.pp * dp * cp * tp; }
  // Sequences per forward/backward: --microbatch, else batch / (dp x microbatch_count()).
  int64_t microbatch_size() const;
  // --microbatches if given (pipeline microbatches, or gradient accumulation with --pp 1),
  // else --pp.
  int microbatch_count() const;
  int64_t microbatches_per_step() const { return batch / dp / microbatch_size(); }
  void validate() const;
  // Whether --export is possible for this layout: not yet for tp > 1 or pp > 1 on a GPU (the
  // shard gathers of export read tensors through the host).
  bool export_supported() const { return device != "cuda" || (tp == 1 && pipeline.pp == 1); }
  // Whether the ranks run the flash-style attention of their device (--attention resolved;
  // validate() refuses a flash request that cannot run).
  bool fused_attention() const;
};

// --attention auto on the CPU: the blockwise kernel from this sequence length on (measured:
// bench/attention, bench/results/attention.md).
inline constexpr int64_t kCpuFlashMinSeq = 1024;
bool cpu_flash_by_default(int64_t seq_len);

struct StepRecord {
  int64_t step = 0;
  float loss = 0;
  float lr = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;  // of the whole job (global batch tokens / step time)
  double mfu = 0;           // per rank: tokens_per_s / dp against one rank's peak
  int64_t peak_bytes = 0;   // the worst rank's peak so far
  int worst_rank = 0;       // ... and which rank that is
  double time_s = 0;
  int64_t comm_bytes = 0;  // bytes rank 0 received over the dp group in this step
  // Bytes received in this step by all ranks together, per mesh dimension (dp: the gradient
  // traffic, over dp x cp with context parallelism, and with --ep the dense gradients'
  // sums over the ep ranks; cp: the attention's exchanges; ep: the MoE token all-to-alls).
  double dp_bytes = 0, tp_bytes = 0, pp_bytes = 0, cp_bytes = 0, ep_bytes = 0;
  double bubble = 0;        // --pp > 1: 1 - (compute time of all ranks) / (ranks x step time)
  bool skipped = false;     // the loss or gradient norm was not finite: no update
  double outer_bytes = 0;   // --sites: DiLoCo's outer exchange, over the cross-site groups
  bool outer_step = false;  // --sites: the step ended with an outer step
  double moe_shadowed = 0;  // --moe-shadow: experts shadowed per microbatch, summed over layers
};

// What each rank saw (the local backend fills every rank's; under mpirun only this
// process's own, the others keep rank = -1).
struct RankRecord {
  int rank = -1;
  mem::Snapshot memory;  // at the end of the last step (peaks over the whole run)
  std::vector<int64_t> step_sent_bytes, step_recv_bytes;  // over dp (x cp), per step
  std::vector<int64_t> step_tp_recv_bytes;                // over the tp group, per step
  std::vector<int64_t> step_pp_recv_bytes;                // over the pp group, per step
  std::vector<int64_t> step_cp_recv_bytes;                // over the cp group, per step
  std::vector<int64_t> step_ep_recv_bytes;                // over the ep group, per step
  std::vector<int64_t> step_outer_recv_bytes;             // --sites: the cross-site group's
  std::vector<float> final_params;  // this rank's flat values (keep_final_params; TP shards,
                                    // the pipeline stage's parameters)
  int64_t allocations_after_first_step = 0;
};

struct TrainResult {
  std::vector<StepRecord> steps;
  std::vector<std::pair<int64_t, float>> val_losses;  // (step, loss)
  int64_t allocations_after_first_step = 0;           // by steps 2..N, worst rank (should be 0)
  std::vector<float> final_params;                    // rank 0's flat (gathered under ZeRO-3)
  std::vector<RankRecord> ranks;
  int64_t padded_params = 0;                // Ψ rounded up to a multiple of dp
  int64_t gathered_param_elems = 0;         // ZeRO-3 parameter pool (unit buffers)
  int64_t gradient_pool_elems = 0;          // ZeRO-2/3 gradient pool (unit buffers)
  int64_t bf16_param_elems = 0;             // --dtype bf16: rank 0's bf16 weight copy (or slots)
  std::vector<PipelineRankStats> pipeline;  // per world rank, with --pp > 1
  int64_t start_step = 0;                   // steps restored from a checkpoint (the last attempt's)
  int restarts = 0;                         // --max-restarts: attempts that failed before this one
  int64_t skipped_steps = 0;                // non-finite steps skipped (the last attempt's)
  // A signal stopped the run (train/stop_signals.h): which (0: it ran to --steps), and the
  // line that says where it stopped (rank 0's process; "" on the others).
  int stop_signal = 0;
  std::string stop_message;
};

TrainResult run_training(const TrainOptions& opts);
// Refuses (exit 2) when mpirun started several processes: with the local backend each would
// run the whole job. run_training calls it for local jobs of several ranks; `train` for any.
void refuse_local_backend_under_mpirun();

}  // namespace mt::train
