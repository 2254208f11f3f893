#include "parallel/data.h"

#include "core/error.h"
#include "core/profile.h"

namespace mt::parallel {

std::vector<Bucket> plan_buckets(const FlatLayout& layout, int64_t bucket_elems, int64_t align) {
  MT_ASSERT(layout.padded_elems % align == 0);
  std::vector<Bucket> out;
  int64_t hi = layout.padded_elems;
  for (int p = layout.num_params() - 1; p >= 0 && hi > 0; --p) {
    const int64_t start = layout.param_offsets[static_cast<size_t>(p)];
    if (p > 0 && hi - start < bucket_elems) continue;  // keep growing the bucket
    const int64_t lo = p == 0 ? 0 : start / align * align;
    if (lo >= hi) continue;  // rounding left it empty: take the next parameter too
    out.push_back({lo, hi, layout.param_of(lo)});
    hi = lo;
  }
  return out;
}

BucketReducer::BucketReducer(comm::Group& dp, const FlatLayout& layout, Tensor grads, Mode mode,
                             int64_t bucket_elems)
    : dp_(dp),
      layout_(layout),
      shard_(dp.rank(), dp.size(), layout.padded_elems),
      grads_(std::move(grads)),
      mode_(mode),
      buckets_(plan_buckets(layout, bucket_elems, dp.size())) {
  MT_ASSERT(grads_.numel() == layout.padded_elems);
  for (const Bucket& b : buckets_) counts_.push_back(shard_.counts(b.lo, b.hi));
  works_.resize(buckets_.size());
}

void BucketReducer::launch(size_t b) {
  const Bucket& k = buckets_[b];
  float* g = grads_.f32();
  const comm::Buf in = comm::device_buf(g + k.lo, k.hi - k.lo);
  if (mode_ == Mode::kAllReduce) {
    works_[b] = dp_.all_reduce_async(in);
  } else {
    // In place: this rank's piece of the bucket is reduced where it lies.
    const int64_t mine = counts_[b][static_cast<size_t>(dp_.rank())];
    const comm::Buf out = comm::device_buf(g + (mine > 0 ? shard_.my_begin(k.lo) : k.lo), mine);
    works_[b] = dp_.reduce_scatter_async(in, out, counts_[b]);
  }
}

void BucketReducer::after_backward(int unit) {
  if (!enabled_) return;
  const int final_from = layout_.unit_first_param[static_cast<size_t>(unit)];
  while (next_ < buckets_.size() && buckets_[next_].first_param >= final_from) launch(next_++);
}

void BucketReducer::finish() {
  profile::Scope p("dp.wait");
  while (next_ < buckets_.size()) launch(next_++);
  for (auto& w : works_) {
    if (w) w->wait();
    w.reset();
  }
  next_ = 0;
}

}  // namespace mt::parallel
