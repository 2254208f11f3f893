// A step's mixture-of-experts report (docs/moe.md): every MoE layer's counters (model::
// MoeStats) summed over the job's ranks, and summarised per layer for the progress line
// and the metrics file: tokens per expert (min, max, coefficient of variation), the share of
// assignments the capacity dropped, the balancing losses.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/gpt.h"

namespace mt::train {

// The flat vector of one step's counters of all the model's MoE layers (global order), this
// rank's layers filled in and the others zero: summed over the ranks that see different
// tokens (one per data-parallel replica and pipeline stage: pass counted = false on the
// other tp ranks, which hold the same numbers), it is the job's.
std::vector<float> moe_counters(const model::Gpt& gpt, bool counted);

// moe_counters' row per MoE layer: the E expert loads, then this many fields (assignments,
// dropped, aux, z, microbatches, experts shadowed).
constexpr int64_t kMoeCounterFields = 6;

struct MoeLayerReport {
  int layer = 0;
  double tokens_min = 0, tokens_max = 0, cv = 0;  // over experts
  double dropped = 0;                             // share of the assignments
  double aux = 0, z = 0;                          // balancing losses, means over microbatches
  double shadowed = 0;         // experts shadowed per microbatch (--moe-shadow), mean
  std::vector<double> tokens;  // routed to each expert (the job's sum)
};
struct MoeReport {
  std::vector<MoeLayerReport> layers;
  double aux_loss = 0, z_loss = 0;  // with their coefficients, summed over layers
  double worst_cv = 0, dropped = 0;
  double shadowed = 0;  // experts shadowed per microbatch, summed over layers
};
MoeReport summarise_moe(const std::vector<float>& summed, const model::GptConfig& c,
                        const model::MoeOptions& o);
nlohmann::json moe_json(const MoeReport& r);
// --moe-balance bias (DeepSeek-V3, "auxiliary-loss-free load balancing"): from the job's
// counters of a step (moe_counters summed over ranks), every expert's selection bias moves
// by `rate` towards balance: +rate when its load is below the layer's mean, -rate above,
// unchanged at the mean. Every rank does it on the same sums: the biases stay identical.
void update_moe_bias(std::vector<float>& bias, const std::vector<float>& summed,
                     const model::GptConfig& c, double rate);
std::string moe_progress(const MoeReport& r);  // " | moe cv 0.21 drop 0.0% aux 1.013"

}  // namespace mt::train
