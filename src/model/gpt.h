// The GPT-2 model of one rank: embeddings, blocks, final norm, tied LM head and the
// fused cross-entropy, with an explicit forward and backward over one microbatch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "model/config.h"
#include "model/layers.h"
#include "model/params.h"
#include "parallel/tp.h"
#include "parallel/unit_hooks.h"

namespace mt::model {

// The parts of the model one rank holds. Without pipeline parallelism: all of it. A
// pipeline stage holds its chunks' blocks, the embeddings on the first stage and the final
// norm and LM head on the last (with tied embeddings the last stage keeps its own copy of
// wte, whose gradient is summed with the first stage's: train/).
struct StageParts {
  bool all_layers = true;
  std::vector<int> layers;  // global block indices, ascending (when !all_layers)
  bool embedding = true;
  bool head = true;
};

// The parameter specs of a stage, in store order: embeddings, blocks, head. The last
// stage's copy of the tied wte goes after the final norm, so that the head unit is one
// consecutive range of parameters.
std::vector<ParamSpec> stage_param_specs(const GptConfig& c, const StageParts& parts);

// Activation recomputation (--recompute): none; selective (the attention probabilities,
// the B·(n_head/t)·T² term, recomputed in backward from qkv); full (each block keeps only
// its input; its whole forward runs again in backward).
enum class Recompute : uint8_t { kNone, kSelective, kFull };
Recompute parse_recompute(const std::string& name);  // "none", "selective", "full"
const char* recompute_name(Recompute r);

// Which parts of backward one call runs: both (Backward), or the zero-bubble split into
// the input gradients (B: what the previous pipeline stage waits for) and the weight
// gradients (W, later).
enum class BackwardPart : uint8_t { kAll, kInput, kWeight };

// Everything one microbatch's backward needs, allocated once and reused. A pipeline slot
// holds one chunk's: `encoded` is then the chunk's input, `blocks` its blocks.
struct Activations {
  int64_t B = 0, T = 0;
  int n_blocks = 0;  // blocks in use (a pipeline slot serves chunks of different sizes)
  std::vector<int32_t> targets;
  std::vector<int32_t> tokens;
  // On a GPU, their device copies (i32), uploaded where they are first read (embed_forward,
  // head_forward); the kernels read these. Undefined on the CPU.
  Tensor tokens_dev, targets_dev;
  const int32_t* token_ids() const {
    return tokens_dev.defined() ? tokens_dev.data<int32_t>() : tokens.data();
  }
  const int32_t* target_ids() const {
    return targets_dev.defined() ? targets_dev.data<int32_t>() : targets.data();
  }
  Tensor encoded;  // [N, C] embedding output = first block's input
  std::vector<BlockActivations> blocks;
  Tensor lnf, lnf_mean, lnf_rstd;  // [N, C], [N], [N]
  Tensor logits;                   // [N, Vp]; turned into d(logits) in place by backward
  Tensor losses, lse;              // [N]
  // Tensor parallelism: logits are this rank's [N, Vp/t] columns; the vocabulary-parallel
  // cross-entropy's row maxima and (sum-exp, target logit) pairs; with --sp the gathered
  // final-norm output [N, C] the LM head reads (lnf holds this rank's rows).
  Tensor ce_max, ce_sums;  // [N], [2N]
  Tensor lnf_full;
  std::vector<BlockGradStash> stash;  // zero-bubble split backward (BackwardPart)
  // The step's dloss (set by whoever runs backward: Gpt::backward, a pipeline stage): the
  // MoE layers weigh their balancing losses with it.
  float dloss = 0;
  // The first sample of the microbatch (the global sample index), the key of its routing in
  // a routing tape (model/routing_tape.h); -1: not recorded or replayed (validation).
  int64_t routing_sample = -1;
};

// The model's units, in forward order, are what data parallelism gathers and reduces
// (parallel/unit_hooks.h): unit 0 the embeddings (wte, wpe), units 1..L the blocks, unit
// L + 1 the head (final norm, and lm_head when untied). Each unit is a consecutive range
// of parameters.
class Gpt {
 public:
  // tp: this rank's tensor-parallel group (size 1: none). The store then holds this rank's
  // slices (tp_shard_specs), each drawn from the global stream; the vocabulary is padded to
  // a multiple of lcm(128, t) (config.vocab_pad_multiple is set here).
  // parts: the stage this rank holds (pipeline parallelism); default the whole model.
  // ep: this rank's expert-parallel group (size 1: none): the store then holds its E/ep
  // experts of every MoE layer (ep_shard_specs), and the MoE layers exchange tokens over it.
  Gpt(const GptConfig& config, uint64_t seed, StoreOptions store = {},
      parallel::tp::TpContext tp = {}, StageParts parts = {}, parallel::ep::EpContext ep = {});

  const GptConfig& config() const { return config_; }
  const parallel::tp::TpContext& tp() const { return tp_; }
  const parallel::ep::EpContext& ep() const { return ep_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }

  const StageParts& parts() const { return parts_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int num_units() const { return num_blocks() + parts_.embedding + parts_.head; }
  int block_unit(int k) const { return k + (parts_.embedding ? 1 : 0); }
  int head_unit() const { return num_units() - 1; }
  // The tied wte, when this rank holds a copy of it (first or last stage), else null.
  Param* wte() { return wte_; }
  // Read-only views of the layers, for inference one position at a time (model/decode.h).
  const Param* wte() const { return wte_; }
  const Param* wpe() const { return wpe_; }  // null with rotary positions
  const Param* lm_head() const { return lm_head_; }
  const Norm& final_norm() const { return ln_f_; }
  const Block& block(int k) const { return blocks_[static_cast<size_t>(k)]; }
  // n_units + 1 entries: unit u is parameters [v[u], v[u + 1]).
  std::vector<int> unit_first_params() const;
  // With --sp, the parameters whose gradients each tp rank computes from its own sequence
  // shard only, partial sums to be added over the tp group (parallel::tp::
  // ReplicatedGradSync): the layer norms and the position embedding. (Row-parallel biases
  // take their gradient from the gathered output gradient: already the full sum.)
  std::vector<int> sequence_parallel_params() const;
  // Called around every unit's forward and backward (null: none).
  void set_hooks(parallel::UnitHooks* hooks) { hooks_ = hooks; }

  // Call before make_activations (the activations it makes depend on it).
  void set_recompute(Recompute r) { recompute_ = r; }
  // Context parallelism (parallel/context.h): this rank holds the rows of its cp split of
  // every sequence; activations are then made for the local length (seq_len / cp), the
  // positions (RoPE tables, the learned table's rows) follow the split, and each block's
  // attention exchanges keys and values over the cp group. Call before make_activations.
  void set_context_parallel(const parallel::cp::CpContext& cp);
  const parallel::cp::CpContext& cp() const { return *cp_; }
  // The global positions of the local rows (empty without context parallelism).
  const std::vector<int32_t>& local_positions() const { return positions_; }
  // Rows of one sequence on this rank: seq_len, or seq_len / cp.
  int64_t local_seq_len() const { return cp_->local_len(config_.seq_len); }
  Recompute recompute() const { return recompute_; }

  // Mixture of experts (model/moe.h): the training options of every MoE layer, and each MoE
  // layer this rank holds with its counters (global block indices ascending; the counters
  // add up the microbatches' backward since the last reset_moe_stats).
  // With o.balance_bias the layers choose their experts with moe_bias() added.
  void set_moe_options(const MoeOptions& o);
  // --moe-balance bias: every MoE layer's selection bias, [global MoE layer][E] (all the
  // model's MoE layers, also those of other pipeline stages: every rank updates all alike).
  std::vector<float>& moe_bias() { return *moe_bias_; }
  const MoeOptions& moe_options() const { return *moe_options_; }
  const std::vector<int>& moe_layers() const { return moe_layers_; }
  const std::vector<MoeStats>& moe_stats() const { return *moe_stats_; }
  // Routing replay (model/routing_tape.h): every MoE layer records its decisions into
  // `tape` (record) or takes them from it, for microbatches with a routing_sample.
  void set_routing_tape(RoutingTape* tape, bool record) {
    tape_ = tape;
    tape_record_ = record;
  }
  void reset_moe_stats() {
    for (MoeStats& s : *moe_stats_) s.reset(config_.moe.n_experts);
  }

  // The whole stage's activations (every block this rank holds, the head if it has it).
  Activations make_activations(int64_t B, int64_t T) const;
  // One pipeline chunk's: n_blocks blocks, the head buffers when with_head, the zero-bubble
  // stash when split.
  Activations make_activations(int64_t B, int64_t T, int n_blocks, bool with_head,
                               bool split) const;

  // Whole model (a stage holding everything). Mean loss over the B*T tokens; keeps in `a`
  // what backward needs.
  float forward(Activations& a, const int32_t* inputs, const int32_t* targets);
  // Accumulates into the gradients d(sum_i dloss * loss_i)/d(params), i over the tokens of
  // the microbatch. dloss = 1 / (tokens in the whole step) gives the mean over a step.
  // With tied embeddings the LM head's weight gradient is added at the end, with the
  // embedding's, so that after each unit's backward every gradient of that unit and of the
  // later units is final (what UnitHooks::after_backward promises).
  void backward(Activations& a, float dloss);

  // ---- the pieces, for a pipeline stage (one chunk = local blocks [k0, k0 + n))
  void set_batch(Activations& a, const int32_t* inputs, const int32_t* targets) const;
  void embed_forward(Activations& a);                  // tokens -> a.encoded
  void blocks_forward(Activations& a, int k0, int n);  // a.encoded -> a.blocks[n - 1].out
  float head_forward(Activations& a);                  // last block's out -> mean loss
  // d(loss) -> dres ([Nl, C], overwritten) = d(last block's out). kInput skips the LM head's
  // weight gradient (head_weight_backward adds it).
  void head_backward(Activations& a, float dloss, float* dres, BackwardPart part);
  // dres: d(chunk output) in, d(chunk input) out.
  void blocks_backward(Activations& a, int k0, int n, float* dres, BackwardPart part);
  void embed_backward(Activations& a, const float* dres);
  void head_weight_backward(Activations& a);  // the LM head's weight gradient

 private:
  void ensure_scratch(int64_t B, int64_t T);
  // --dtype bf16 with the CPU's T × T attention kernel on bf16 operands (not the blockwise
  // kernel, context parallelism or a GPU): its q, k, v and dO rounding workspace, and the
  // blocks' attention output in bf16.
  bool mixed_attention() const;
  parallel::UnitHooks& hooks() { return hooks_ ? *hooks_ : no_hooks_; }
  const float* chunk_output(const Activations& a) const {
    return a.n_blocks == 0 ? a.encoded.f32()
                           : a.blocks[static_cast<size_t>(a.n_blocks) - 1].out.f32();
  }
  // The LM head's input: the final norm's output (gathered with --sp).
  const float* head_input(const Activations& a) const {
    return tp_.sp ? a.lnf_full.f32() : a.lnf.f32();
  }
  // With tied embeddings on a stage holding both, the LM head's weight gradient waits for
  // the embedding unit (see backward).
  bool defer_head_weight() const { return config_.tied && parts_.embedding && parts_.head; }

  GptConfig config_;
  StageParts parts_;
  Recompute recompute_ = Recompute::kNone;
  // With recomputation, the one set of the tensors blocks do not keep (allocated with the
  // first activations; every Activations made later points into it).
  mutable BlockActivations recomputed_;
  ParamStore params_;
  Param* wte_ = nullptr;
  Param* wpe_ = nullptr;
  Param* lm_head_ = nullptr;  // = wte_ when tied
  Norm ln_f_;
  // Rotary positions: the cos/sin tables of seq_len positions, read by every block (on the
  // heap, so that the blocks' pointers survive moving the model). Null: learned positions.
  std::unique_ptr<RopeTables> rope_;
  // Context parallelism (on the heap: the blocks point at it); size 1 by default. With cp,
  // the global positions of the local rows (the learned table's rows to add).
  std::unique_ptr<parallel::cp::CpContext> cp_;
  std::vector<int32_t> positions_;
  std::vector<Block> blocks_;
  BlockScratch scratch_;
  Tensor dres_;  // [N, C] gradient of the residual stream
  int64_t scratch_tokens_ = 0;
  parallel::UnitHooks* hooks_ = nullptr;
  parallel::UnitHooks no_hooks_;
  parallel::tp::TpContext tp_;
  parallel::ep::EpContext ep_;
  // --dtype bf16 on the CPU: the cross-entropy writes the LM head's output gradient in bf16
  // over the logits (kernels::ce_backward_bf16_in_place), which the head's backward GEMMs
  // read as it is. On a GPU the f32 gradient is rounded by the GEMM call (kernels/cuda).
  bool bf16_head_grad() const { return mp_ != nullptr && !device::on_cuda(); }
  // The LM head's backward GEMMs from the output gradient the cross-entropy left over the
  // logits (bf16 or f32, bf16_head_grad): dx (may be null) and dw (may be null).
  void head_gemms_backward(Activations& a, float* dx, float* dw);
  // --dtype bf16 (StoreOptions::bf16_copy): the GEMM workspaces, made with the scratch; on
  // the heap, so that the blocks' pointers to it survive moving the model. Null: f32.
  std::unique_ptr<MixedPrecision> mp_;
  // On the heap: the MoE layers point at them.
  std::unique_ptr<MoeOptions> moe_options_;
  std::unique_ptr<std::vector<MoeStats>> moe_stats_;
  std::unique_ptr<std::vector<float>> moe_bias_;  // on the heap: the layers point into it
  std::vector<int> moe_layers_;
  RoutingTape* tape_ = nullptr;
  bool tape_record_ = false;
  // Points an MoE block's activations at the tape before its forward.
  void set_replay(BlockActivations& b, const Activations& a, int k) const;
};

// Training FLOPs per token (forward + backward, no recomputation): see docs/flops.md.
double training_flops_per_token(const GptConfig& c, int64_t T);

}  // namespace mt::model
