#include "parallel/layout.h"

#include <algorithm>

#include "core/error.h"

namespace mt::parallel {

int FlatLayout::param_of(int64_t e) const {
  MT_ASSERT(e >= 0 && e < elems());
  auto it = std::upper_bound(param_offsets.begin(), param_offsets.end(), e);
  return static_cast<int>(it - param_offsets.begin()) - 1;
}

std::vector<int64_t> Shard::counts(int64_t a, int64_t b) const {
  std::vector<int64_t> c(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r)
    c[static_cast<size_t>(r)] =
        std::max<int64_t>(0, std::min(b, lo(r) + shard_elems) - std::max(a, lo(r)));
  return c;
}

}  // namespace mt::parallel
