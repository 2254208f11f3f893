#include "comm/mpi.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "comm/job.h"
#include "comm/mpi_job.h"
#include "core/error.h"

namespace mt::comm {

int mpi_env_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

int mpi_env_world_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

namespace {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(fmt::format("MPI {} failed: {}", what, std::string(msg, static_cast<size_t>(len))),
              ExitCode::kRunFailure);
}

// Polls `done` until it says true: first yielding the core, then with pauses of 20 and, after
// about 20 ms, 200 us. On a host whose cores the ranks share (namespace hosts, or more ranks
// than cores), a rank that polls takes the core from a rank still computing: MPI's blocking
// calls poll (mpi_yield_when_idle only yields between polls). On the 2-host benchmark one
// host's forward and backward took 36.5 ms a step against the other's 23 ms while the other's
// ranks polled for their 40 ms gradient all-reduce (docs/multihost.md). Open MPI moves TCP
// data only inside its calls: 200 us between them is 25 KB at 1 Gbit/s, which the socket
// buffers hold.
template <typename Done>
void poll_patiently(Done done) {
  for (int i = 0; !done(); ++i) {
    if (i < 100)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(i < 1000 ? 20 : 200));
  }
}

// A collective its caller started async (OpCall::async: every rank alike) is started
// nonblocking and waited for patiently on the progress thread; a blocking one is MPI's
// blocking call (its caller waits in it or behind it: a poll answers soonest).
template <typename Blocking, typename Start>
void collective(const OpCall& c, Blocking blocking, Start start, const char* what) {
  if (!c.async) {
    check_mpi(blocking(), what);
    return;
  }
  MPI_Request req;
  check_mpi(start(&req), what);
  poll_patiently([&] {
    int flag = 0;
    check_mpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), what);
    return flag != 0;
  });
}

int to_int(int64_t v, const char* what) {
  if (v > INT32_MAX)
    fail("{} of {} bytes is over MPI's 2 GiB count limit; split it into smaller calls", what, v);
  return static_cast<int>(v);
}

// --- reduction in f32 in rank order: the same arithmetic as the local backend, so both
// backends give bitwise the same results.

constexpr int64_t kBlock = 2048;

void reduce_pieces(void* out, const std::vector<const void*>& pieces, int64_t len, DType dt,
                   ReduceOp op) {
  alignas(64) float acc[kBlock];
  const int n = static_cast<int>(pieces.size());
  const int64_t es = dtype_bytes(dt);
  auto load = [&](float* dst, const void* src, int64_t off, int64_t m) {
    if (dt == DType::kF32) {
      std::memcpy(dst, static_cast<const float*>(src) + off, static_cast<size_t>(m) * 4);
    } else {
      const uint16_t* p = static_cast<const uint16_t*>(src) + off;
      for (int64_t i = 0; i < m; ++i) {
        uint32_t u = static_cast<uint32_t>(p[i]) << 16;
        std::memcpy(&dst[i], &u, 4);
      }
    }
  };
  alignas(64) float tmp[kBlock];
  for (int64_t b = 0; b < len; b += kBlock) {
    int64_t m = std::min(kBlock, len - b);
    load(acc, pieces[0], b, m);
    for (int k = 1; k < n; ++k) {
      const float* x = tmp;
      if (dt == DType::kF32)
        x = static_cast<const float*>(pieces[static_cast<size_t>(k)]) + b;
      else
        load(tmp, pieces[static_cast<size_t>(k)], b, m);
      if (op == ReduceOp::kMax)
        for (int64_t i = 0; i < m; ++i) acc[i] = std::max(acc[i], x[i]);
      else
        for (int64_t i = 0; i < m; ++i) acc[i] += x[i];
    }
    if (op == ReduceOp::kAvg)
      for (int64_t i = 0; i < m; ++i) acc[i] /= static_cast<float>(n);
    if (dt == DType::kF32) {
      std::memcpy(static_cast<char*>(out) + b * es, acc, static_cast<size_t>(m) * 4);
    } else {
      bf16* p = reinterpret_cast<bf16*>(static_cast<char*>(out) + b * es);
      for (int64_t i = 0; i < m; ++i) p[i] = f32_to_bf16(acc[i]);
    }
  }
}

class MpiP2pWork : public Work {
 public:
  MpiP2pWork(std::shared_ptr<OpCall> call, P2pDone done, MPI_Request req, std::string group)
      : call_(std::move(call)), done_(std::move(done)), req_(req), group_(std::move(group)) {}
  bool test() override {
    if (finished_) return rethrow();
    int flag = 0;
    MPI_Status st;
    check_mpi(MPI_Test(&req_, &flag, &st), "test");
    if (flag) complete(st);
    return flag != 0 && rethrow();
  }
  void wait() override {
    if (finished_) {
      rethrow();
      return;
    }
    // Poll with growing pauses: an oversubscribed host needs the core back.
    poll_patiently([&] {
      int flag = 0;
      MPI_Status st;
      check_mpi(MPI_Test(&req_, &flag, &st), "test");
      if (flag) complete(st);
      return flag != 0;
    });
    rethrow();
  }

 private:
  void complete(const MPI_Status& st) {
    finished_ = true;
    int64_t es = dtype_bytes(call_->dtype);
    if (call_->op == OpType::kRecv) {
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      if (count != call_->out_elems * es)
        error_ = std::make_exception_ptr(Error(
            fmt::format("send/recv mismatch on {}: recv #{} from {} (tag {}) expects {} bytes but "
                        "the message has {}",
                        group_, call_->seq, call_->peer, call_->tag, call_->out_elems * es, count),
            ExitCode::kRunFailure));
      else
        call_->recv_bytes = count;
    } else {
      call_->sent_bytes = call_->in_elems * es;
    }
    done_(*call_, error_);
  }
  bool rethrow() {
    if (error_) std::rethrow_exception(error_);
    return true;
  }
  std::shared_ptr<OpCall> call_;
  P2pDone done_;
  MPI_Request req_;
  std::string group_;
  bool finished_ = false;
  std::exception_ptr error_;
};

class MpiBackend : public Backend {
 public:
  MpiBackend(MPI_Comm comm, std::string name, bool check_headers)
      : comm_(comm),
        name_(std::move(name)),
        check_headers_(check_headers),
        tracker_(&mem::current_tracker()) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiBackend() override {
    if (scratch_.ptr) mem::release(scratch_);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  std::string_view kind() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void run(OpCall& c) override;
  WorkPtr start_p2p(std::shared_ptr<OpCall> call, P2pDone done) override {
    const int64_t bytes =
        dtype_bytes(call->dtype) * (call->op == OpType::kSend ? call->in_elems : call->out_elems);
    MPI_Request req;
    if (call->op == OpType::kSend)
      check_mpi(
          MPI_Isend(call->in, to_int(bytes, "send"), MPI_BYTE, call->peer, call->tag, comm_, &req),
          "send");
    else
      check_mpi(
          MPI_Irecv(call->out, to_int(bytes, "recv"), MPI_BYTE, call->peer, call->tag, comm_, &req),
          "recv");
    return std::make_shared<MpiP2pWork>(call, std::move(done), req, name_);
  }
  std::unique_ptr<Backend> split(OpCall& call, int color, int key, const std::string& name,
                                 std::vector<int>* world_ranks) override {
    if (check_headers_) check_header(call);
    MPI_Comm sub;
    check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "comm_split");
    if (sub == MPI_COMM_NULL) return nullptr;
    int n = 0, world = 0;
    MPI_Comm_size(sub, &n);
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    world_ranks->assign(static_cast<size_t>(n), 0);
    check_mpi(MPI_Allgather(&world, 1, MPI_INT, world_ranks->data(), 1, MPI_INT, sub), "allgather");
    return std::make_unique<MpiBackend>(sub, name, check_headers_);
  }

 private:
  void* scratch(int64_t bytes) {
    if (scratch_.bytes < bytes) {
      if (scratch_.ptr) mem::release(scratch_);
      mem::ScopedTracker scope(*tracker_);
      scratch_ = mem::allocate(bytes, mem::Category::kCommunication);
    }
    return scratch_.ptr;
  }
  void check_header(const OpCall& c);
  // Reduce-scatter: every rank receives its piece from every other rank and reduces the n
  // pieces in rank order into `out`.
  void reduce_scatter_pieces(const OpCall& c, const std::vector<int64_t>& counts, void* out);

  MPI_Comm comm_;
  std::string name_;
  bool check_headers_;
  int rank_ = 0, size_ = 1;
  // The tracker current when the group was made, which outlives it: scratch_ is counted
  // against it, not against whichever thread's tracker an op runs under (the world group
  // outlives fn, and with it a tracker fn scopes; ~MpiBackend frees the block).
  mem::Tracker* tracker_ = nullptr;
  mem::Block scratch_;
  std::vector<int> a2a_sc_, a2a_sd_, a2a_rc_, a2a_rd_;  // all_to_all's byte counts, displacements
};

// Debug mode: every rank shares (seq, op, dtype, reduce, root, count, counts hash) first.
void MpiBackend::check_header(const OpCall& c) {
  int64_t h = 1469598103934665603LL;
  for (int64_t v : c.counts) h = (h ^ v) * 1099511628211LL;
  int64_t mine[7] = {c.seq,
                     static_cast<int64_t>(c.op),
                     static_cast<int64_t>(c.dtype),
                     static_cast<int64_t>(c.reduce),
                     c.op == OpType::kBroadcast ? c.peer : 0,
                     c.op == OpType::kAllReduce || c.op == OpType::kBroadcast ? c.in_elems : 0,
                     c.op == OpType::kAllToAll ? 0 : h};
  std::vector<int64_t> all(static_cast<size_t>(7 * size_));
  check_mpi(MPI_Allgather(mine, 7, MPI_INT64_T, all.data(), 7, MPI_INT64_T, comm_), "allgather");
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  static const char* kField[7] = {
      "sequence number", "op", "dtype", "reduction", "root", "element count", "per-rank counts"};
  for (int r = 0; r < size_; ++r)
    for (int f = 0; f < 7; ++f)
      if (all[static_cast<size_t>(7 * r + f)] != mine[f]) {
        const int64_t* o = &all[static_cast<size_t>(7 * r)];
        if (f <= 1)
          throw Error(fmt::format("collective mismatch on {}: group rank {} is in {} #{}, group "
                                  "rank {} (world rank {}) in {} #{}",
                                  name_, r, op_name(static_cast<OpType>(o[1])), o[0], rank_, world,
                                  op_name(c.op), c.seq),
                      ExitCode::kRunFailure);
        throw Error(fmt::format("collective mismatch on {}: {} #{}: group ranks {} and {} disagree "
                                "on the {} ({} vs {})",
                                name_, op_name(c.op), c.seq, r, rank_, kField[f], o[f], mine[f]),
                    ExitCode::kRunFailure);
      }
  if (c.op == OpType::kAllToAll) {
    std::vector<int64_t> theirs(static_cast<size_t>(size_));
    check_mpi(MPI_Alltoall(c.counts.data(), 1, MPI_INT64_T, theirs.data(), 1, MPI_INT64_T, comm_),
              "alltoall");
    for (int r = 0; r < size_; ++r)
      if (theirs[static_cast<size_t>(r)] != c.recv_counts[static_cast<size_t>(r)])
        throw Error(fmt::format("collective mismatch on {}: all_to_all #{}: group rank {} sends "
                                "{} elems to group rank {}, which expects {}",
                                name_, c.seq, r, theirs[static_cast<size_t>(r)], rank_,
                                c.recv_counts[static_cast<size_t>(r)]),
                    ExitCode::kRunFailure);
  }
}

void MpiBackend::reduce_scatter_pieces(const OpCall& c, const std::vector<int64_t>& counts,
                                       void* out) {
  const int n = size_;
  const int64_t es = dtype_bytes(c.dtype);
  std::vector<int64_t> off(static_cast<size_t>(n) + 1, 0);
  int64_t largest = 0;
  for (int r = 0; r < n; ++r) {
    off[static_cast<size_t>(r) + 1] = off[static_cast<size_t>(r)] + counts[static_cast<size_t>(r)];
    largest = std::max(largest, counts[static_cast<size_t>(r)]);
  }
  const int64_t mine = counts[static_cast<size_t>(rank_)];
  // Rounds of at most `seg` elements of every piece: the scratch holds one round's n pieces
  // (n · kMpiSegmentBytes at most) whatever the buffer's size. Every rank derives the same
  // rounds from the same counts.
  const int64_t seg = std::max<int64_t>(1, std::min(largest, kMpiSegmentBytes / es));
  const int64_t rounds = largest == 0 ? 1 : (largest + seg - 1) / seg;
  char* buf = static_cast<char*>(scratch(std::max<int64_t>(1, n * std::min(mine, seg) * es)));
  std::vector<int> scount(static_cast<size_t>(n)), sdispl(static_cast<size_t>(n)),
      rcount(static_cast<size_t>(n)), rdispl(static_cast<size_t>(n));
  std::vector<const void*> pieces(static_cast<size_t>(n));
  for (int64_t k = 0; k < rounds; ++k) {
    auto part = [&](int64_t count) { return std::clamp<int64_t>(count - k * seg, 0, seg); };
    const int64_t len = part(mine);
    for (int r = 0; r < n; ++r) {
      auto i = static_cast<size_t>(r);
      scount[i] = r == rank_ ? 0 : to_int(part(counts[i]) * es, "reduce_scatter piece");
      sdispl[i] = to_int((off[i] + std::min(k * seg, counts[i])) * es, "reduce_scatter input");
      rcount[i] = r == rank_ ? 0 : to_int(len * es, "reduce_scatter piece");
      rdispl[i] = to_int(r * len * es, "reduce_scatter scratch");
    }
    collective(
        c,
        [&] {
          return MPI_Alltoallv(c.in, scount.data(), sdispl.data(), MPI_BYTE, buf, rcount.data(),
                               rdispl.data(), MPI_BYTE, comm_);
        },
        [&](MPI_Request* r) {
          return MPI_Ialltoallv(c.in, scount.data(), sdispl.data(), MPI_BYTE, buf, rcount.data(),
                                rdispl.data(), MPI_BYTE, comm_, r);
        },
        "alltoallv");
    for (int r = 0; r < n; ++r)
      pieces[static_cast<size_t>(r)] =
          r == rank_ ? static_cast<const char*>(c.in) + (off[static_cast<size_t>(r)] + k * seg) * es
                     : buf + r * len * es;
    if (len > 0)
      reduce_pieces(static_cast<char*>(out) + k * seg * es, pieces, len, c.dtype, c.reduce);
  }
}

void MpiBackend::run(OpCall& c) {
  if (check_headers_) check_header(c);
  const int n = size_;
  const int64_t es = dtype_bytes(c.dtype);
  auto sz = static_cast<size_t>(n);
  switch (c.op) {
    case OpType::kAllReduce: {
      const int64_t E = c.in_elems;
      std::vector<int64_t> counts(sz);
      for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = E * (r + 1) / n - E * r / n;
      const int64_t lo = E * rank_ / n, mine = counts[static_cast<size_t>(rank_)];
      char* out = static_cast<char*>(c.out);
      reduce_scatter_pieces(c, counts, out + lo * es);
      std::vector<int> rc(sz), rd(sz);
      for (int r = 0; r < n; ++r) {
        rc[static_cast<size_t>(r)] = to_int(counts[static_cast<size_t>(r)] * es, "all_reduce");
        rd[static_cast<size_t>(r)] = to_int(E * r / n * es, "all_reduce");
      }
      if (E % n == 0)  // the same on every rank: equal chunks, MPI's equal-count call
        collective(
            c,
            [&] { return MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, out, rc[0], MPI_BYTE, comm_); },
            [&](MPI_Request* r) {
              return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_BYTE, out, rc[0], MPI_BYTE, comm_, r);
            },
            "allgather");
      else
        collective(
            c,
            [&] {
              return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, out, rc.data(), rd.data(), MPI_BYTE,
                                    comm_);
            },
            [&](MPI_Request* r) {
              return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, out, rc.data(), rd.data(), MPI_BYTE,
                                     comm_, r);
            },
            "allgatherv");
      c.recv_bytes = c.sent_bytes = ((n - 1) * mine + (E - mine)) * es;
      break;
    }
    case OpType::kReduceScatter: {
      reduce_scatter_pieces(c, c.counts, c.out);
      int64_t total = 0;
      for (int64_t v : c.counts) total += v;
      c.recv_bytes = (n - 1) * c.counts[static_cast<size_t>(rank_)] * es;
      c.sent_bytes = (total - c.counts[static_cast<size_t>(rank_)]) * es;
      break;
    }
    case OpType::kAllGather: {
      std::vector<int> rc(sz), rd(sz);
      int64_t total = 0;
      for (int r = 0; r < n; ++r) {
        rc[static_cast<size_t>(r)] = to_int(c.counts[static_cast<size_t>(r)] * es, "all_gather");
        rd[static_cast<size_t>(r)] = to_int(total * es, "all_gather");
        total += c.counts[static_cast<size_t>(r)];
      }
      char* out = static_cast<char*>(c.out);
      char* own = out + rd[static_cast<size_t>(rank_)];
      if (c.equal_pieces) {
        const void* in = c.in == own ? MPI_IN_PLACE : c.in;
        collective(
            c, [&] { return MPI_Allgather(in, rc[0], MPI_BYTE, out, rc[0], MPI_BYTE, comm_); },
            [&](MPI_Request* r) {
              return MPI_Iallgather(in, rc[0], MPI_BYTE, out, rc[0], MPI_BYTE, comm_, r);
            },
            "allgather");
      } else {
        if (c.in != own && c.in_elems > 0)
          std::memmove(own, c.in, static_cast<size_t>(c.in_elems * es));
        collective(
            c,
            [&] {
              return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, out, rc.data(), rd.data(), MPI_BYTE,
                                    comm_);
            },
            [&](MPI_Request* r) {
              return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, out, rc.data(), rd.data(), MPI_BYTE,
                                     comm_, r);
            },
            "allgatherv");
      }
      c.recv_bytes = (total - c.in_elems) * es;
      c.sent_bytes = (n - 1) * c.in_elems * es;
      break;
    }
    case OpType::kBroadcast: {
      const int bytes = to_int(c.in_elems * es, "broadcast");
      collective(
          c, [&] { return MPI_Bcast(c.out, bytes, MPI_BYTE, c.peer, comm_); },
          [&](MPI_Request* r) { return MPI_Ibcast(c.out, bytes, MPI_BYTE, c.peer, comm_, r); },
          "bcast");
    }
      if (rank_ == c.peer)
        c.sent_bytes = (n - 1) * c.in_elems * es;
      else
        c.recv_bytes = c.in_elems * es;
      break;
    case OpType::kAllToAll: {
      // Members, sized once: MoE's dispatch runs this several times per layer.
      auto& sc = a2a_sc_;
      auto& sd = a2a_sd_;
      auto& rc = a2a_rc_;
      auto& rd = a2a_rd_;
      for (auto* v : {&sc, &sd, &rc, &rd}) v->resize(sz);
      int64_t so = 0, ro = 0;
      for (size_t r = 0; r < sz; ++r) {
        sc[r] = to_int(c.counts[r] * es, "all_to_all");
        sd[r] = to_int(so * es, "all_to_all");
        rc[r] = to_int(c.recv_counts[r] * es, "all_to_all");
        rd[r] = to_int(ro * es, "all_to_all");
        so += c.counts[r];
        ro += c.recv_counts[r];
        if (static_cast<int>(r) != rank_) {
          c.sent_bytes += c.counts[r] * es;
          c.recv_bytes += c.recv_counts[r] * es;
        }
      }
      if (c.equal_pieces)
        collective(
            c, [&] { return MPI_Alltoall(c.in, sc[0], MPI_BYTE, c.out, rc[0], MPI_BYTE, comm_); },
            [&](MPI_Request* r) {
              return MPI_Ialltoall(c.in, sc[0], MPI_BYTE, c.out, rc[0], MPI_BYTE, comm_, r);
            },
            "alltoall");
      else
        collective(
            c,
            [&] {
              return MPI_Alltoallv(c.in, sc.data(), sd.data(), MPI_BYTE, c.out, rc.data(),
                                   rd.data(), MPI_BYTE, comm_);
            },
            [&](MPI_Request* r) {
              return MPI_Ialltoallv(c.in, sc.data(), sd.data(), MPI_BYTE, c.out, rc.data(),
                                    rd.data(), MPI_BYTE, comm_, r);
            },
            "alltoallv");
      break;
    }
    case OpType::kBarrier:
      collective(
          c, [&] { return MPI_Barrier(comm_); },
          [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); }, "barrier");
      break;
    default:
      MT_ASSERT(false);
  }
}

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

std::vector<int32_t> gather_to_world_root(const std::vector<int32_t>& mine) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    fail(
        "gather_to_world_root: MPI is not running (call it under mpirun, after a job and "
        "before the process ends)");
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int n = to_int(static_cast<int64_t>(mine.size()), "gather_to_world_root");
  std::vector<int> counts(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  check_mpi(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD), "gather");
  std::vector<int32_t> all;
  if (rank == 0) {
    int64_t total = 0;
    for (int r = 0; r < size; ++r) {
      displs[static_cast<size_t>(r)] = to_int(total, "gather_to_world_root");
      total += counts[static_cast<size_t>(r)];
    }
    all.resize(static_cast<size_t>(total));
  }
  check_mpi(MPI_Gatherv(mine.data(), n, MPI_INT32_T, all.data(), counts.data(), displs.data(),
                        MPI_INT32_T, 0, MPI_COMM_WORLD),
            "gatherv");
  return all;
}

void launch_mpi(const LaunchOptions& opts, const std::function<void(Group& world)>& fn,
                const std::string& world_name) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE)
      fail_run("this MPI grants thread level {}, but the mpi backend needs MPI_THREAD_MULTIPLE",
               provided);
    std::atexit(finalize_mpi);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (opts.world_size > 1 && opts.world_size != size)
    fail("the job asks for {} ranks but mpirun started {}; run mpirun -np {}", opts.world_size,
         size, opts.world_size);
  const char* dbg = std::getenv("MESHTRAIN_COMM_DEBUG");
  bool check = opts.check_headers || (dbg && std::string(dbg) == "1");
  try {
    std::optional<mem::ScopedTracker> scope;
    if (mem::Tracker* t = tracker_for_rank(opts, rank)) scope.emplace(*t);
    std::unique_ptr<Job> job = make_mpi_job(opts.timeout_s, rank);
    {
      auto ctx = std::make_shared<RankContext>(rank, size, opts.recorder_capacity, job.get());
      job->add_rank(ctx);
      MPI_Comm world_comm;
      MPI_Comm_dup(MPI_COMM_WORLD, &world_comm);
      std::vector<int> all(static_cast<size_t>(size));
      for (int r = 0; r < size; ++r) all[static_cast<size_t>(r)] = r;
      Group world(ctx, std::make_unique<MpiBackend>(world_comm, world_name, check), world_name,
                  all);
      if (opts.timeout_s > 0) job->start_watchdog();
      fn(world);
      world.barrier();  // nobody leaves while others still talk to it
      job->stop_watchdog();
    }
  } catch (const std::exception& e) {
    auto* err = dynamic_cast<const Error*>(&e);
    int code = err ? err->exit_code() : static_cast<int>(ExitCode::kRunFailure);
    std::string what = e.what();
    if (what.rfind("[rank ", 0) != 0) what = fmt::format("[rank {}] {}", rank, what);
    std::fprintf(stderr, "error: %s\n", what.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }
}

}  // namespace mt::comm
