// Splitting the model's layers into pipeline chunks (pp·v consecutive ranges, in model
// order). Balanced by an estimated cost per layer, with the embedding's cost added to the
// first chunk and the final norm + LM head + loss to the last (heavy at large vocabularies),
// or given explicitly (`--pp-layers 5,7,7,5`), refused when it does not cover every layer
// exactly once (Megatron-LM#1304 silently built 28 of 30 layers).
#pragma once

#include <string>
#include <vector>

namespace mt::parallel::pp {

struct Partition {
  std::vector<int> layers;   // blocks per chunk, pp·v entries, each >= 1, summing to n_layer
  std::vector<int> first;    // first block of each chunk (prefix sums), plus n_layer at the end
  std::vector<double> cost;  // estimated cost per chunk

  int num_chunks() const { return static_cast<int>(layers.size()); }
};

// What the balanced split weighs: an estimated forward cost per token (FLOPs) of each GPT
// block, 24·C² + 4·T·C (docs/flops.md), the embedding's lookup (2·C) on the first chunk and
// the LM head GEMM plus the softmax (2·C·Vp + 5·Vp) on the last. One function for the trainer
// and the planner, so that a plan predicts the split its run will use.
struct ChunkCosts {
  std::vector<double> layer;  // per block
  double first_extra = 0, last_extra = 0;
};
ChunkCosts gpt_chunk_costs(int n_layer, double d_model, double seq, double padded_vocab);

// The split minimising the largest chunk cost (ties: the earliest chunks smallest).
// layer_cost: one entry per block. Refuses fewer blocks than chunks.
Partition balanced_partition(const std::vector<double>& layer_cost, double first_extra,
                             double last_extra, int chunks);

// Checks an explicit split: `chunks` counts, each >= 1, summing to the number of blocks.
Partition explicit_partition(const std::vector<int>& layers, const std::vector<double>& layer_cost,
                             double first_extra, double last_extra, int chunks);

// "5,7,7,5" -> {5, 7, 7, 5}; refuses anything else with the expected form.
std::vector<int> parse_layer_counts(const std::string& text);

}  // namespace mt::parallel::pp
