#include "parallel/tp.h"

#include <algorithm>

#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"

namespace mt::parallel::tp {

void all_reduce(const TpContext& tp, float* x, int64_t elems) {
  if (!tp.active()) return;
  profile::Scope p("tp.comm");
  tp.group->all_reduce(comm::device_buf(x, elems));
}

void all_gather_rows(const TpContext& tp, const float* local, float* full, int64_t local_elems) {
  profile::Scope p("tp.comm");
  if (!tp.active()) {
    if (full != local) kernels::copy(full, local, local_elems);
    return;
  }
  tp.group->all_gather(comm::device_buf(const_cast<float*>(local), local_elems),
                       comm::device_buf(full, local_elems * tp.size));
}

void all_gather_rows(const TpContext& tp, const bf16* local, bf16* full, int64_t local_elems) {
  profile::Scope p("tp.comm");
  MT_ASSERT(tp.active());
  tp.group->all_gather(
      comm::Buf(const_cast<bf16*>(local), local_elems, DType::kBF16, device::current()),
      comm::Buf(full, local_elems * tp.size, DType::kBF16, device::current()));
}

void reduce_scatter_rows(const TpContext& tp, const float* full, float* local,
                         int64_t local_elems) {
  profile::Scope p("tp.comm");
  if (!tp.active()) {
    if (full != local) kernels::copy(local, full, local_elems);
    return;
  }
  tp.group->reduce_scatter(comm::device_buf(const_cast<float*>(full), local_elems * tp.size),
                           comm::device_buf(local, local_elems));
}

void all_reduce_max(const TpContext& tp, float* x, int64_t elems) {
  if (!tp.active()) return;
  profile::Scope p("tp.comm");
  tp.group->all_reduce(comm::device_buf(x, elems), comm::ReduceOp::kMax);
}

ReplicatedGradSync::ReplicatedGradSync(std::vector<std::pair<int64_t, int64_t>> ranges, int64_t lo,
                                       int64_t hi) {
  int64_t n = 0;
  for (auto [a, b] : ranges) {
    a = std::max(a, lo);
    b = std::min(b, hi);
    if (a >= b) continue;
    ranges_.emplace_back(a - lo, b - lo);
    n += b - a;
  }
  packed_ = Tensor::empty({std::max<int64_t>(n, 1)}, DType::kF32, mem::Category::kCommunication);
}

void ReplicatedGradSync::sync(const TpContext& tp, float* grads) {
  if (!tp.active()) return;
  sync(*tp.group, grads);
}

void ReplicatedGradSync::sync(comm::Group& group, float* grads) {
  if (group.size() == 1 || ranges_.empty()) return;
  float* buf = packed_.f32();
  int64_t k = 0;
  for (auto [a, b] : ranges_) {
    kernels::copy(buf + k, grads + a, b - a);
    k += b - a;
  }
  group.all_reduce(comm::device_buf(buf, k));
  k = 0;
  for (auto [a, b] : ranges_) {
    kernels::copy(grads + a, buf + k, b - a);
    k += b - a;
  }
}

}  // namespace mt::parallel::tp
