#include "parallel/expert.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace mt::parallel::ep {

namespace {
// An exchange from this rank's rows per global expert (`mine`, [E]) and the rows every source
// sends to each of this rank's experts (`to_me`, [ep][E/ep]).
Exchange exchange_of(int ranks, int64_t experts, const std::vector<int64_t>& mine,
                     const std::vector<int64_t>& to_me) {
  Exchange x;
  x.ranks = ranks;
  x.local_experts = experts / ranks;
  const int64_t El = x.local_experts;
  x.send_rows.assign(static_cast<size_t>(ranks), 0);
  for (int64_t e = 0; e < experts; ++e)
    x.send_rows[static_cast<size_t>(e / El)] += mine[static_cast<size_t>(e)];
  x.table = to_me;
  x.recv_rows.assign(static_cast<size_t>(ranks), 0);
  x.expert_rows.assign(static_cast<size_t>(El), 0);
  for (int s = 0; s < ranks; ++s)
    for (int64_t e = 0; e < El; ++e) {
      const int64_t c = x.table[static_cast<size_t>(s * El + e)];
      x.recv_rows[static_cast<size_t>(s)] += c;
      x.expert_rows[static_cast<size_t>(e)] += c;
      x.received += c;
    }
  return x;
}

void check_split(int64_t experts, int n) {
  if (experts % n != 0)
    fail("{} experts do not split over {} expert-parallel ranks (use an --ep that divides {})",
         experts, n, experts);
}
}  // namespace

Exchange plan_exchange(const EpContext& ep, const std::vector<int64_t>& counts, int64_t experts) {
  check_split(experts, ep.size);
  std::vector<int32_t> mine(static_cast<size_t>(experts)), theirs(mine.size());
  for (int64_t e = 0; e < experts; ++e)
    mine[static_cast<size_t>(e)] = static_cast<int32_t>(counts[static_cast<size_t>(e)]);
  ep.group->all_to_all(comm::Buf(mine.data(), experts, DType::kI32),
                       comm::Buf(theirs.data(), experts, DType::kI32));
  return exchange_of(ep.size, experts, counts, std::vector<int64_t>(theirs.begin(), theirs.end()));
}

std::vector<uint8_t> choose_shadows(const std::vector<int64_t>& all, int ranks, int64_t experts,
                                    double above) {
  const int64_t El = experts / ranks;
  const auto rows = [&](int s, int64_t e) {
    return all[static_cast<size_t>(s) * static_cast<size_t>(experts) + static_cast<size_t>(e)];
  };
  std::vector<uint8_t> shadowed(static_cast<size_t>(experts), 0);
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
  int64_t total = 0;
  for (int s = 0; s < ranks; ++s)
    for (int64_t e = 0; e < experts; ++e) {
      load[static_cast<size_t>(e / El)] += rows(s, e);
      total += rows(s, e);
    }
  const double mean = static_cast<double>(total) / ranks;
  for (int64_t chosen = 0; chosen < El; ++chosen) {
    const int heavy = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    const int64_t peak = load[static_cast<size_t>(heavy)];
    if (total == 0 || static_cast<double>(peak) <= above * mean) break;
    int64_t best = -1, best_foreign = 0;  // the heavy rank's expert with the most foreign rows
    for (int64_t e = heavy * El; e < (heavy + 1) * El; ++e) {
      if (shadowed[static_cast<size_t>(e)]) continue;
      int64_t foreign = 0;
      for (int s = 0; s < ranks; ++s)
        if (s != heavy) foreign += rows(s, e);
      if (foreign > best_foreign) best = e, best_foreign = foreign;
    }
    if (best < 0) break;
    std::vector<int64_t> after = load;  // the owner keeps its own rows; the others take theirs
    after[static_cast<size_t>(heavy)] -= best_foreign;
    for (int s = 0; s < ranks; ++s)
      if (s != heavy) after[static_cast<size_t>(s)] += rows(s, best);
    if (*std::max_element(after.begin(), after.end()) >= peak) break;
    shadowed[static_cast<size_t>(best)] = 1;
    load = after;
  }
  return shadowed;
}

Exchange plan_exchange_shadowed(const EpContext& ep, const std::vector<int64_t>& counts,
                                int64_t experts, double above, std::vector<uint8_t>& shadowed) {
  const int n = ep.size;
  check_split(experts, n);
  std::vector<int32_t> mine(static_cast<size_t>(experts)), gathered(mine.size() * n);
  for (int64_t e = 0; e < experts; ++e)
    mine[static_cast<size_t>(e)] = static_cast<int32_t>(counts[static_cast<size_t>(e)]);
  ep.group->all_gather(comm::Buf(mine.data(), experts, DType::kI32),
                       comm::Buf(gathered.data(), experts * n, DType::kI32));
  const std::vector<int64_t> all(gathered.begin(), gathered.end());
  shadowed = choose_shadows(all, n, experts, above);
  // The rows that travel: a shadowed expert's stay where they are.
  const int64_t El = experts / n;
  const auto travels = [&](int s, int64_t e) {
    return shadowed[static_cast<size_t>(e)] ? 0 : all[static_cast<size_t>(s * experts + e)];
  };
  std::vector<int64_t> sent(static_cast<size_t>(experts)), to_me(static_cast<size_t>(n * El));
  for (int64_t e = 0; e < experts; ++e) sent[static_cast<size_t>(e)] = travels(ep.rank, e);
  for (int s = 0; s < n; ++s)
    for (int64_t le = 0; le < El; ++le)
      to_me[static_cast<size_t>(s * El + le)] = travels(s, ep.rank * El + le);
  return exchange_of(n, experts, sent, to_me);
}

int64_t max_received_rows(int ranks, int64_t n, int64_t top_k, int64_t experts, int64_t capacity) {
  const int64_t El = experts / ranks;
  const int64_t dropless = ranks * n * std::min(top_k, El);
  return capacity > 0 ? std::min(dropless, ranks * El * capacity) : dropless;
}

void exchange_rows(const EpContext& ep, const Exchange& x, const float* send, float* recv,
                   int64_t width, bool reverse) {
  std::vector<int64_t> out(static_cast<size_t>(x.ranks)), in(out.size());
  int64_t n_out = 0, n_in = 0;
  for (size_t r = 0; r < out.size(); ++r) {
    out[r] = (reverse ? x.recv_rows[r] : x.send_rows[r]) * width;
    in[r] = (reverse ? x.send_rows[r] : x.recv_rows[r]) * width;
    n_out += out[r];
    n_in += in[r];
  }
  ep.group->all_to_all_v(comm::Buf(const_cast<float*>(send), n_out), comm::Buf(recv, n_in), out,
                         in);
}

namespace {
void permute(const Exchange& x, const float* from, float* to, int64_t width, bool to_expert) {
  // Where each local expert's rows start in expert-major order, moved on past each source.
  std::vector<int64_t> expert_at(static_cast<size_t>(x.local_experts), 0);
  for (int64_t e = 1; e < x.local_experts; ++e)
    expert_at[static_cast<size_t>(e)] =
        expert_at[static_cast<size_t>(e - 1)] + x.expert_rows[static_cast<size_t>(e - 1)];
  int64_t source_at = 0;  // source-major: source by source, its experts in order
  for (int s = 0; s < x.ranks; ++s)
    for (int64_t e = 0; e < x.local_experts; ++e) {
      const int64_t rows = x.table[static_cast<size_t>(s * x.local_experts + e)];
      int64_t& b = expert_at[static_cast<size_t>(e)];
      const int64_t src = to_expert ? source_at : b, dst = to_expert ? b : source_at;
      if (rows > 0)
        std::memcpy(to + dst * width, from + src * width,
                    static_cast<size_t>(rows * width) * sizeof(float));
      source_at += rows;
      b += rows;
    }
}
}  // namespace

void to_expert_major(const Exchange& x, const float* source_major, float* expert_major,
                     int64_t width) {
  permute(x, source_major, expert_major, width, true);
}

void to_source_major(const Exchange& x, const float* expert_major, float* source_major,
                     int64_t width) {
  permute(x, expert_major, source_major, width, false);
}

}  // namespace mt::parallel::ep
