#include "train/moe_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::train {

namespace {
constexpr int64_t kFields = kMoeCounterFields;
}

std::vector<float> moe_counters(const model::Gpt& gpt, bool counted) {
  const model::GptConfig& c = gpt.config();
  const int64_t E = c.moe.n_experts, per = E + kFields;
  std::vector<int> global;  // the model's MoE layers, in order
  for (int64_t l = 0; l < c.n_layer; ++l)
    if (c.moe.is_moe_layer(l)) global.push_back(static_cast<int>(l));
  std::vector<float> v(global.size() * static_cast<size_t>(per), 0.f);
  if (!counted) return v;
  const std::vector<int>& mine = gpt.moe_layers();
  for (size_t i = 0; i < mine.size(); ++i) {
    const size_t slot = static_cast<size_t>(
        std::lower_bound(global.begin(), global.end(), mine[i]) - global.begin());
    const model::MoeStats& s = gpt.moe_stats()[i];
    float* out = v.data() + slot * static_cast<size_t>(per);
    for (int64_t e = 0; e < E; ++e) out[e] = static_cast<float>(s.routed[static_cast<size_t>(e)]);
    out[E] = static_cast<float>(s.assignments);
    out[E + 1] = static_cast<float>(s.dropped);
    out[E + 2] = static_cast<float>(s.aux);
    out[E + 3] = static_cast<float>(s.z);
    out[E + 4] = static_cast<float>(s.microbatches);
    out[E + 5] = static_cast<float>(s.shadowed);
  }
  return v;
}

void update_moe_bias(std::vector<float>& bias, const std::vector<float>& summed,
                     const model::GptConfig& c, double rate) {
  const int64_t E = c.moe.n_experts, per = E + kFields, L = c.n_moe_layers();
  MT_ASSERT(static_cast<int64_t>(summed.size()) == L * per &&
            static_cast<int64_t>(bias.size()) == L * E);
  for (int64_t l = 0; l < L; ++l) {
    const float* load = summed.data() + l * per;
    double mean = 0;
    for (int64_t e = 0; e < E; ++e) mean += load[e];
    mean /= static_cast<double>(E);
    for (int64_t e = 0; e < E; ++e) {
      const double d = mean - load[e];  // counts are whole numbers: exact in f32 (< 2^24)
      bias[static_cast<size_t>(l * E + e)] += static_cast<float>(d > 0 ? rate : d < 0 ? -rate : 0);
    }
  }
}

MoeReport summarise_moe(const std::vector<float>& summed, const model::GptConfig& c,
                        const model::MoeOptions& o) {
  MoeReport r;
  const int64_t E = c.moe.n_experts, per = E + kFields;
  size_t slot = 0;
  double assignments = 0, dropped = 0;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (!c.moe.is_moe_layer(l)) continue;
    const float* v = summed.data() + slot++ * static_cast<size_t>(per);
    MoeLayerReport L;
    L.layer = static_cast<int>(l);
    double sum = 0, sq = 0;
    L.tokens.assign(v, v + E);
    L.tokens_min = v[0];
    for (int64_t e = 0; e < E; ++e) {
      L.tokens_min = std::min<double>(L.tokens_min, v[e]);
      L.tokens_max = std::max<double>(L.tokens_max, v[e]);
      sum += v[e];
      sq += static_cast<double>(v[e]) * v[e];
    }
    const double mean = sum / static_cast<double>(E);
    L.cv =
        mean > 0 ? std::sqrt(std::max(0.0, sq / static_cast<double>(E) - mean * mean)) / mean : 0;
    L.dropped = v[E] > 0 ? v[E + 1] / v[E] : 0;
    const double mbs = v[E + 4];
    L.aux = mbs > 0 ? v[E + 2] / mbs : 0;
    L.z = mbs > 0 ? v[E + 3] / mbs : 0;
    L.shadowed = mbs > 0 ? v[E + 5] / mbs : 0;  // every ep rank counts each microbatch's alike
    r.shadowed += L.shadowed;
    r.aux_loss += o.aux_loss * L.aux;
    r.z_loss += o.z_loss * L.z;
    r.worst_cv = std::max(r.worst_cv, L.cv);
    assignments += v[E];
    dropped += v[E + 1];
    r.layers.push_back(L);
  }
  r.dropped = assignments > 0 ? dropped / assignments : 0;
  return r;
}

nlohmann::json moe_json(const MoeReport& r) {
  nlohmann::json layers = nlohmann::json::array();
  for (const MoeLayerReport& L : r.layers)
    layers.push_back({{"layer", L.layer},
                      {"tokens_min", L.tokens_min},
                      {"tokens_max", L.tokens_max},
                      {"tokens", L.tokens},
                      {"cv", L.cv},
                      {"dropped", L.dropped},
                      {"aux", L.aux},
                      {"z", L.z},
                      {"shadowed", L.shadowed}});
  return {{"aux_loss", r.aux_loss}, {"z_loss", r.z_loss},     {"worst_cv", r.worst_cv},
          {"dropped", r.dropped},   {"shadowed", r.shadowed}, {"layers", layers}};
}

std::string moe_progress(const MoeReport& r) {
  double aux = 0;
  for (const MoeLayerReport& L : r.layers) aux += L.aux;
  if (!r.layers.empty()) aux /= static_cast<double>(r.layers.size());
  std::string line =
      fmt::format(" | moe cv {:.2f} drop {:.1f}% balance {:.3f}", r.worst_cv, 100 * r.dropped, aux);
  if (r.shadowed > 0) line += fmt::format(" shadow {:.1f}", r.shadowed);
  return line;
}

}  // namespace mt::train
