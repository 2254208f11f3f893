// Parameter specs and the parameter store. A spec carries the Hugging Face GPT-2 name,
// the global shape, the initialisation, and how the tensor splits over tensor
// parallelism, so that any shard can generate exactly its own slice from the global
// Philox stream (DESIGN.md, idea 2).
#pragma once

#include <cstdint>
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
  kQkvRows,     // dim 0 split inside each of the q, k, v blocks (whole heads per rank)
};

struct ParamSpec {
  std::string name;  // Hugging Face GPT-2 name
  Shape shape;       // global shape, our layout (linear weights are [out, in])
  Init init = Init::kZeros;
  float init_std = 0.f;
  int64_t real_rows = -1;  // rows >= real_rows are padding, initialised to 0 (-1: none)
  TpSplit tp_split = TpSplit::kReplicated;
  bool weight_decay = false;  // matrices only
  bool hf_transposed = false;  // stored [out, in]; HF Conv1D stores [in, out]
  int layer = -1;              // block index, -1 for embeddings and the final norm
};

std::vector<ParamSpec> gpt_param_specs(const GptConfig& c);
int64_t count_params(const std::vector<ParamSpec>& specs);

// One parameter: a view of the flat value buffer and one of the flat gradient buffer.
struct Param {
  ParamSpec spec;
  Tensor value;
  Tensor grad;
  int64_t offset_elems = 0;  // into the flat buffers
};

// All parameters of a rank in two contiguous buffers (values, gradients), in spec order,
// so that gradient buckets and optimizer shards are plain ranges.
class ParamStore {
 public:
  ParamStore(std::vector<ParamSpec> specs, DType dtype);
  // Fills every value from Philox by global element index.
  void initialize(uint64_t seed);
  void zero_grads() { flat_grads_.zero_(); }

  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  Param& get(const std::string& name);
  const Param* find(const std::string& name) const;
  Tensor& flat_values() { return flat_values_; }
  Tensor& flat_grads() { return flat_grads_; }
  int64_t numel() const { return flat_values_.numel(); }

 private:
  std::vector<Param> params_;
  Tensor flat_values_;
  Tensor flat_grads_;
};

// Draws a parameter's global elements [first, first + n) into out.
void init_param_range(const ParamSpec& spec, uint64_t seed, int64_t first, int64_t n,
                      float* out);

}  // namespace mt::model
