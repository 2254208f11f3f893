#include "parallel/pipeline/partition.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace mt::parallel::pp {

namespace {

Partition finish(std::vector<int> layers, const std::vector<double>& layer_cost, double first_extra,
                 double last_extra) {
  Partition p;
  p.layers = std::move(layers);
  p.first.push_back(0);
  for (int n : p.layers) p.first.push_back(p.first.back() + n);
  for (size_t c = 0; c < p.layers.size(); ++c) {
    double sum = 0;
    for (int l = p.first[c]; l < p.first[c + 1]; ++l) sum += layer_cost[l];
    p.cost.push_back(sum);
  }
  p.cost.front() += first_extra;
  p.cost.back() += last_extra;
  return p;
}

}  // namespace

ChunkCosts gpt_chunk_costs(int n_layer, double d_model, double seq, double padded_vocab) {
  const double C = d_model, T = seq, Vp = padded_vocab;
  ChunkCosts c;
  c.layer.assign(static_cast<size_t>(std::max(0, n_layer)), 24 * C * C + 4 * T * C);
  c.first_extra = 2 * C;
  c.last_extra = 2 * C * Vp + 5 * Vp;
  return c;
}

Partition balanced_partition(const std::vector<double>& layer_cost, double first_extra,
                             double last_extra, int chunks) {
  const int L = static_cast<int>(layer_cost.size());
  if (chunks < 1) fail("{} pipeline chunks: need at least 1", chunks);
  if (L < chunks)
    fail(
        "n_layer {} is fewer than the {} pipeline chunks (pp x virtual stages): every chunk "
        "needs at least one layer (use a smaller --pp / --virtual-stages or more layers)",
        L, chunks);
  std::vector<double> prefix(L + 1, 0);
  for (int l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + layer_cost[l];
  auto range_cost = [&](int c, int lo, int hi) {
    double v = prefix[hi] - prefix[lo];
    if (c == 0) v += first_extra;
    if (c == chunks - 1) v += last_extra;
    return v;
  };
  // best[c][l]: the smallest possible max cost of chunks 0..c covering layers [0, l).
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(chunks, std::vector<double>(L + 1, kInf));
  std::vector<std::vector<int>> cut(chunks, std::vector<int>(L + 1, -1));
  for (int l = 1; l <= L; ++l) best[0][l] = range_cost(0, 0, l);
  // Over the cut k, best[c - 1][k] grows (within the 1e-12 of the ties) and the last chunk's
  // cost falls by at least the cheapest layer. With every layer dearer than the ties, the
  // scan below therefore improves at each k until the two cross and never after: start it
  // just before the crossing (found by bisection) and stop once best[c - 1][k] is past the
  // best found. Same cuts as the full scan, O(chunks · L · log L) instead of O(chunks · L²)
  // (thousands of layers took the planner tens of seconds).
  // "Dearer than the ties" relative to the sums' rounding: a layer lighter than the prefix
  // sums' error leaves the last chunk's cost flat (a review found 6,6 for the full scan's
  // 4,8 with 1e-8 layers among 1e9 ones): such costs take the full scan.
  const double sums = prefix[L] + first_extra + last_extra;
  const bool steep = *std::min_element(layer_cost.begin(), layer_cost.end()) >
                     1e-9 + 16 * std::numeric_limits<double>::epsilon() * sums;
  for (int c = 1; c < chunks; ++c)
    for (int l = c + 1; l <= L; ++l) {
      int from = c;
      if (steep) {
        int lo = c, hi = l;  // the first k with best[c - 1][k] >= range_cost(c, k, l)
        while (lo < hi) {
          const int mid = lo + (hi - lo) / 2;
          if (best[c - 1][mid] >= range_cost(c, mid, l))
            hi = mid;
          else
            lo = mid + 1;
        }
        from = std::max(c, std::min(lo, l - 1) - 1);
      }
      for (int k = from; k < l; ++k) {
        if (steep && best[c - 1][k] >= best[c][l] + 2e-12) break;
        const double v = std::max(best[c - 1][k], range_cost(c, k, l));
        if (v < best[c][l] - 1e-12) {  // strict: the earliest cut wins ties
          best[c][l] = v;
          cut[c][l] = k;
        }
      }
    }
  std::vector<int> layers(chunks);
  int hi = L;
  for (int c = chunks - 1; c > 0; --c) {
    const int k = cut[c][hi];
    layers[c] = hi - k;
    hi = k;
  }
  layers[0] = hi;
  return finish(std::move(layers), layer_cost, first_extra, last_extra);
}

Partition explicit_partition(const std::vector<int>& layers, const std::vector<double>& layer_cost,
                             double first_extra, double last_extra, int chunks) {
  const int L = static_cast<int>(layer_cost.size());
  const std::string given = fmt::format("{}", fmt::join(layers, ","));
  if (static_cast<int>(layers.size()) != chunks)
    fail("--pp-layers {} has {} entries but the pipeline has {} chunks (pp x virtual stages)",
         given, layers.size(), chunks);
  // The first and the last chunk may hold no layer: the embedding alone, the final norm, LM
  // head and loss alone (Llama 3 405B's split, Megatron-Core's
  // --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split).
  for (size_t c = 0; c < layers.size(); ++c) {
    const bool end = chunks > 1 && (c == 0 || c + 1 == layers.size());
    if (layers[c] < (end ? 0 : 1))
      fail(
          "--pp-layers {}: chunk {} has {} layers; every chunk but the first and the last (which "
          "may hold the embedding or the LM head alone) needs at least one",
          given, c, layers[c]);
  }
  const int sum = std::accumulate(layers.begin(), layers.end(), 0);
  if (sum != L)
    fail(
        "--pp-layers {} covers {} layers but the model has n_layer {}: {} (every layer must be "
        "in exactly one chunk)",
        given, sum, L,
        sum < L ? fmt::format("{} layer(s) would be dropped", L - sum)
                : fmt::format("{} layer(s) would be repeated or invented", sum - L));
  return finish(layers, layer_cost, first_extra, last_extra);
}

std::vector<int> parse_layer_counts(const std::string& text) {
  std::vector<int> out;
  size_t i = 0;
  while (i <= text.size()) {
    const size_t j = std::min(text.find(',', i), text.size());
    const std::string item = text.substr(i, j - i);
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      fail("--pp-layers '{}' must be comma-separated layer counts, e.g. 5,7,7,5", text);
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

}  // namespace mt::parallel::pp
