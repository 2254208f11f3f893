#include "comm/simulated_link.h"

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace mt::comm {

namespace {
struct Links {
  std::mutex mu;
  std::map<const Group*, std::pair<double, double>> rate_latency;
  std::atomic<int> count{0};  // the common case, no link anywhere, without the lock
};
Links& links() {
  static Links l;
  return l;
}

double hops(OpType op, int n) {
  switch (op) {
    case OpType::kAllReduce:
      return 2.0 * (n - 1);
    case OpType::kReduceScatter:
    case OpType::kAllGather:
    case OpType::kBroadcast:
      return n - 1;
    case OpType::kAllToAll:
    case OpType::kBarrier:
    case OpType::kSend:
    case OpType::kRecv:
      return 1;
    case OpType::kSplit:
      return 0;
  }
  return 0;
}
}  // namespace

void simulate_link(const Group& g, double bytes_per_s, double latency_s) {
  if (!(bytes_per_s > 0) || !(latency_s >= 0))
    fail("a simulated link needs a rate > 0 and a latency >= 0 (got {} bytes/s, {} s)", bytes_per_s,
         latency_s);
  Links& l = links();
  std::lock_guard lock(l.mu);
  l.rate_latency[&g] = {bytes_per_s, latency_s};
  l.count = static_cast<int>(l.rate_latency.size());
}

double simulated_link_s(const Group& g, OpType op, int ranks, int64_t recv_bytes) {
  Links& l = links();
  if (l.count.load() == 0 || ranks < 2) return 0;
  std::lock_guard lock(l.mu);
  const auto it = l.rate_latency.find(&g);
  if (it == l.rate_latency.end()) return 0;
  const auto [rate, latency] = it->second;
  return hops(op, ranks) * latency + static_cast<double>(recv_bytes) / rate;
}

bool any_simulated_link() { return links().count.load() > 0; }

void forget_simulated_link(const Group& g) {
  Links& l = links();
  if (l.count.load() == 0) return;
  std::lock_guard lock(l.mu);
  l.rate_latency.erase(&g);
  l.count = static_cast<int>(l.rate_latency.size());
}

}  // namespace mt::comm
