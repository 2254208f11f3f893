// Where the parameters lie in a rank's flat buffers, as plain numbers (parallel/ does not
// know the model): parameter i is elements [param_offsets[i], param_offsets[i + 1]), unit
// u is parameters [unit_first_param[u], unit_first_param[u + 1]). The buffers are padded
// to `padded_elems`, a multiple of the DP size, so that every rank's shard has the same
// length; the padding (fewer than DP elements) is zero and belongs to the last unit.
#pragma once

#include <cstdint>
#include <vector>

namespace mt::parallel {

struct FlatLayout {
  std::vector<int64_t> param_offsets;  // n_params + 1 entries; the last is the real count
  std::vector<int> unit_first_param;   // n_units + 1 entries; the last is n_params
  int64_t padded_elems = 0;

  int num_params() const { return static_cast<int>(param_offsets.size()) - 1; }
  int num_units() const { return static_cast<int>(unit_first_param.size()) - 1; }
  int64_t elems() const { return param_offsets.back(); }
  // Unit u's elements [unit_lo(u), unit_hi(u)); the last unit includes the padding.
  int64_t unit_lo(int u) const { return param_offsets[unit_first_param[u]]; }
  int64_t unit_hi(int u) const {
    return u + 1 == num_units() ? padded_elems : param_offsets[unit_first_param[u + 1]];
  }
  // The parameter that holds element e (e < elems()).
  int param_of(int64_t e) const;
};

// Ψ rounded up to a multiple of n.
inline int64_t pad_to(int64_t elems, int64_t n) { return (elems + n - 1) / n * n; }

// The shard of DP rank `rank` of `size`: elements [lo(), hi()) of the padded flat buffer,
// shard_elems = padded / size each. ZeRO stages 1-3 give each rank the optimizer state,
// then the gradients, then the parameters of exactly this range.
struct Shard {
  int rank = 0, size = 1;
  int64_t shard_elems = 0;
  Shard() = default;
  Shard(int r, int n, int64_t padded) : rank(r), size(n), shard_elems(padded / n) {}
  int64_t lo(int r) const { return r * shard_elems; }
  int64_t lo() const { return lo(rank); }
  int64_t hi() const { return lo() + shard_elems; }
  // Elements of [a, b) that fall in each rank's shard, in rank order: the `counts` of a
  // reduce-scatter or all-gather over that range.
  std::vector<int64_t> counts(int64_t a, int64_t b) const;
  // Where this rank's part of [a, b) starts (an element index of the flat buffer).
  int64_t my_begin(int64_t a) const { return a > lo() ? a : lo(); }
};

}  // namespace mt::parallel
