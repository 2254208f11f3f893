#include "cli/calibrate_hosts.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace mt::cli {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

plan::LinkCurve allreduce_curve(comm::Group& world, comm::Group* g, bool quick) {
  plan::LinkCurve curve;
  const int64_t largest = int64_t(quick ? 1 : 16) << 20;
  std::vector<float> buf(size_t(largest / 4), 1.0f);
  for (int64_t bytes = 1024; bytes <= largest; bytes *= 4) {
    // Medians, not the best: training sees the link as it usually is (TCP's window and
    // the delay relay's pace vary from message to message).
    const int reps = quick ? 3 : bytes <= (int64_t(256) << 10) ? 9 : 5;
    std::vector<double> t;
    world.barrier();
    for (int r = 0; r <= reps; ++r) {  // the first is the warm-up
      world.barrier();
      const double t0 = now_s();
      if (g) g->all_reduce(comm::Buf(buf.data(), bytes / 4));
      if (r > 0) t.push_back(now_s() - t0);
    }
    if (g) {
      curve.bytes.push_back(double(bytes));
      curve.seconds.push_back(median(t));
    }
  }
  if (g) curve.ranks = g->size();
  return curve;
}

}  // namespace mt::cli
