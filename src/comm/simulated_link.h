// A simulated link on a group, for benchmarks on one machine (docs/diloco.md, "A shaped
// link"): from the call on, every collective of the group lasts at least hops x latency_s +
// the bytes this rank receives / bytes_per_s, from its start (the thread running it, the
// caller's or the group's progress thread for an async op, sleeps the rest). hops: 2 (n - 1)
// for an all-reduce (a ring's), n - 1 for reduce-scatter, all-gather and broadcast, 1 for an
// all-to-all, a barrier, a send or a receive. Each rank has a link of its own. Kept beside
// Group (a table keyed by the group, read by Group::execute) rather than in it: a benchmark
// device, not part of a group's contract. Set it before the group's first op.
#pragma once

#include <cstdint>

#include "comm/types.h"

namespace mt::comm {

class Group;

void simulate_link(const Group& g, double bytes_per_s, double latency_s);
// The time the link gives an op of `op` over `ranks` ranks that received `recv_bytes` on this
// rank (0 when the group has no simulated link).
double simulated_link_s(const Group& g, OpType op, int ranks, int64_t recv_bytes);
void forget_simulated_link(const Group& g);  // the group is going away
// Whether any group has a simulated link (one atomic load: every op asks).
bool any_simulated_link();

}  // namespace mt::comm
