// Parameter specs and the parameter store. A spec carries the Hugging Face GPT-2 name,
// the global shape, the initialisation, and how the tensor splits over tensor
// parallelism, so that any shard can generate exactly its own slice from the global
// Philox stream (DESIGN.md, idea 2).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace mt::model {

enum class Init : uint8_t { kNormal, kZeros, kOnes };

// How a tensor is divided over the TP group (used by the tensor-parallel layers).
enum class TpSplit : uint8_t {
  kReplicated,  // every TP rank holds all of it (layer norms, row-parallel biases)
  kRows,        // dim 0 split: column-parallel weight [out, in] / its bias; vocab rows
  kCols,        // dim 1 split: row-parallel weight [out, in]
  kBlockRows,   // dim 0 split inside each of its row blocks (q|k|v: whole heads per rank;
                // SwiGLU's gate|up): ParamSpec::row_blocks
};

struct ParamSpec {
  std::string name;  // Hugging Face GPT-2 name
  Shape shape;       // global shape, our layout (linear weights are [out, in])
  Init init = Init::kZeros;
  float init_std = 0.f;
  int64_t real_rows = -1;  // rows >= real_rows are padding, initialised to 0 (-1: none)
  TpSplit tp_split = TpSplit::kReplicated;
  // kBlockRows: the global row count of each block, in order (GPT-2's c_attn: C, C, C; with
  // grouped-query attention C, kv, kv; SwiGLU's gate|up: F, F). Each splits over tp alone.
  std::vector<int64_t> row_blocks;
  bool weight_decay = false;   // matrices only
  bool hf_transposed = false;  // stored [out, in]; HF Conv1D stores [in, out]
  int layer = -1;              // block index, -1 for embeddings and the final norm
  // Read by a GEMM (a block's four linear weights, the LM head's weight: lm_head, or wte
  // when tied and the rank holds the head): with --dtype bf16 it has a bf16 working copy.
  bool gemm_weight = false;
  // Tensor parallelism: `shape` is this rank's slice of `global_shape` (empty: the same,
  // no TP). tp_rank of tp_size picks the slice by tp_split (tp_shard_specs).
  Shape global_shape;
  int tp_rank = 0, tp_size = 1;
  // Expert parallelism (--ep): a routed expert tensor ([E, ...], dim 0 the expert) is split
  // over the ep group by whole experts, ep rank r holding experts [r·E/ep, (r+1)·E/ep)
  // (ep_shard_specs). Experts are tp-replicated, so the two splits never meet in one tensor.
  bool expert = false;
  int ep_rank = 0, ep_size = 1;
  const Shape& full_shape() const { return global_shape.empty() ? shape : global_shape; }
};

std::vector<ParamSpec> gpt_param_specs(const GptConfig& c);
int64_t count_params(const std::vector<ParamSpec>& specs);

// One parameter: a view of the flat value buffer and one of the flat gradient buffer.
struct Param {
  ParamSpec spec;
  Tensor value;
  Tensor grad;
  int64_t offset_elems = 0;  // into the flat buffers
  // --dtype bf16, GEMM weights only: the bf16 working copy the GEMMs read (a view of the
  // flat bf16 buffer, or of a ZeRO-3 unit slot), and its offset in the flat bf16 layout
  // (-1: none).
  Tensor value_bf16;
  int64_t bf16_offset_elems = -1;
};

// How a ParamStore holds its buffers. Data parallelism pads the flat buffers to a multiple
// of the DP size (every rank's ZeRO shard the same length; the padding stays zero), and
// ZeRO-2/3 keep no full-size gradient (and, stage 3, value) buffer: the views are bound
// later into per-unit buffers (parallel/zero.h).
struct StoreOptions {
  int64_t pad_multiple = 1;
  bool full_values = true;
  bool full_grads = true;
  // Mixed precision (docs/mixed_precision.md): a bf16 copy of the GEMM weights, refreshed
  // from the f32 values (the master weights). Full: one flat buffer of them all; else
  // (ZeRO-3) the views are bound later into per-unit slots, like the values.
  bool bf16_copy = false;
  bool full_bf16 = true;
};

// All parameters of a rank in two contiguous buffers (values, gradients), in spec order,
// so that gradient buckets and optimizer shards are plain ranges.
class ParamStore {
 public:
  ParamStore(std::vector<ParamSpec> specs, DType dtype, StoreOptions options = {});
  // Fills every value from Philox by global element index (skipped without full values).
  void initialize(uint64_t seed);
  // Draws flat elements [first, first + n) (across parameters; padding is 0) into out: the
  // same numbers as initialize() puts there, so a ZeRO-3 shard initialises alone.
  void initialize_range(uint64_t seed, int64_t first, int64_t n, float* out) const;
  void zero_grads();  // on the rank's threads (kernels::zero) in host memory
  // Points the value (or gradient) views of parameters [first, end) into `buffer`, whose
  // element 0 is the first one's element 0 (they are consecutive, as in the flat buffer).
  void bind_values(int first, int end, const Tensor& buffer);
  void bind_grads(int first, int end, const Tensor& buffer);
  // The bf16 copies of the GEMM weights among parameters [first, end), packed from element
  // 0 of `buffer` (bf16) in parameter order.
  void bind_bf16(int first, int end, const Tensor& buffer);
  // value_bf16 = bf16(value) (round to nearest even) for the GEMM weights in [first, end).
  void refresh_bf16(int first, int end);
  void refresh_bf16() { refresh_bf16(0, static_cast<int>(params_.size())); }
  bool has_bf16() const { return bf16_copy_; }
  // Elements of the bf16 copy of parameters [first, end) (the GEMM weights among them).
  int64_t bf16_elems(int first, int end) const;

  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  // fn(param, a, b) for each parameter that overlaps flat elements [lo, hi), [a, b) the
  // overlap in flat element indices (a rank's optimizer shard may cut parameters).
  template <class Fn>
  void for_each_in_range(int64_t lo, int64_t hi, Fn&& fn) const {
    for (const Param& p : params_) {
      const int64_t a = std::max(lo, p.offset_elems);
      const int64_t b = std::min(hi, p.offset_elems + shape_numel(p.spec.shape));
      if (a < b) fn(p, a, b);
    }
  }
  Param& get(const std::string& name);
  const Param* find(const std::string& name) const;
  Tensor& flat_values() { return flat_values_; }
  Tensor& flat_grads() { return flat_grads_; }
  Tensor& flat_bf16() { return flat_bf16_; }              // undefined unless full bf16 copy
  int64_t numel() const { return numel_; }                // real parameters (Ψ)
  int64_t padded_numel() const { return padded_numel_; }  // the flat buffers' length

 private:
  std::vector<Param> params_;
  int64_t numel_ = 0, padded_numel_ = 0;
  Tensor flat_values_;
  Tensor flat_grads_;
  bool bf16_copy_ = false;
  Tensor flat_bf16_;
};

// Draws a parameter's global elements [first, first + n) into out.
void init_param_range(const ParamSpec& spec, uint64_t seed, int64_t first, int64_t n, float* out);

// ---- tensor parallelism -------------------------------------------------------------
// The specs of tp rank `rank` of `size`: each spec's shape becomes its slice (kRows: a block
// of rows; kCols: a block of columns; kBlockRows: the rank's rows inside each row block (its
// heads of q, k and v; its part of gate and of up);
// kReplicated: all of it), global_shape keeps the whole. Refuses a split that does not
// divide (the layout is checked before, with a better message: Gpt's tp refusals).
std::vector<ParamSpec> tp_shard_specs(std::vector<ParamSpec> specs, int rank, int size);
// ---- expert parallelism -------------------------------------------------------------
// The specs of ep rank `rank` of `size`: each routed expert tensor's shape becomes its
// E/size experts (dim 0), global_shape keeps the whole; other specs are unchanged. Refuses
// an expert count that does not divide.
std::vector<ParamSpec> ep_shard_specs(std::vector<ParamSpec> specs, int rank, int size);
// Calls fn(local_first, global_first, n) for each contiguous run of a (sharded) parameter:
// local elements [local_first, +n) are global elements [global_first, +n).
void for_each_tp_run(const ParamSpec& spec,
                     const std::function<void(int64_t, int64_t, int64_t)>& fn);
// Draws local elements [first, first + n) of a (sharded) parameter: the global stream's
// values at the matching global indices, so TP = 1 and TP = T start from the same weights.
void init_param_local(const ParamSpec& spec, uint64_t seed, int64_t first, int64_t n, float* out);
// Copies this shard's slice out of the whole tensor `global` (tests, export).
void tp_slice(const ParamSpec& spec, const float* global, float* out);

}  // namespace mt::model
