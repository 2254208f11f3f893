#include "comm/local.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

#include "core/error.h"

namespace mt::comm {

namespace {

// What a rank posts about its current collective; read by the others (by value, so a rank
// that throws leaves nothing dangling behind).
struct Header {
  int64_t seq = 0;
  OpType op = OpType::kBarrier;
  DType dtype = DType::kF32;
  ReduceOp reduce = ReduceOp::kSum;
  int peer = -1;
  int tag = 0;
  int64_t in_elems = 0;
  int64_t out_elems = 0;
};

struct alignas(64) Slot {
  // Phase counter: 3*seq + 1 header posted, + 2 own chunk reduced, + 3 done reading others.
  std::atomic<int64_t> progress{0};
  Header hdr;
  std::vector<int64_t> counts, recv_counts;
  const void* in = nullptr;
  void* out = nullptr;
};

class P2pWork;

struct P2pReq {
  std::shared_ptr<OpCall> call;
  P2pDone done;
  std::shared_ptr<P2pWork> work;
};

struct Mailbox {
  std::mutex mu;
  std::deque<P2pReq> sends, recvs;
};

}  // namespace

struct LocalShared {
  LocalJob* job = nullptr;
  std::string name;
  int n = 1;
  std::vector<int> world_ranks;
  std::unique_ptr<Slot[]> slots;
  std::unique_ptr<Mailbox[]> boxes;  // n*n, index src*n + dst
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> sleepers{0};
  std::atomic<int> copying{0};  // ranks inside a data phase (reading others' buffers)
};

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// A rank that leaves a collective because the job aborted must not unwind (and free) the
// buffers it posted while a peer still reads them. Every data phase registers in
// sh.copying and then checks the abort (CopyGuard); the leaving rank, which has seen the
// abort, waits for sh.copying to drain. With a seq_cst fence on both sides (after the
// increment, before the drain's first read) either the peer sees the abort and copies
// nothing, or the leaving rank sees its count and waits: no peer starts a copy after the
// wait ended. A copy never blocks, so the wait is short and needs no deadline (a deadline
// let a rank preempted mid-copy under load read or write freed memory).
[[noreturn]] void throw_aborted(LocalShared& sh) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  while (sh.copying.load() > 0) std::this_thread::yield();
  throw Error(sh.job->abort_reason(), ExitCode::kRunFailure);
}

// Spin, yield a little, then block: briefly where 8-12 ranks share 2 cores (DESIGN.md), for
// up to the job's spin_s where every rank has cores of its own (LaunchOptions).
template <typename Pred>
void wait_until(LocalShared& sh, Pred&& pred) {
  for (int i = 0; i < 200; ++i) {
    if (pred()) return;
    cpu_relax();
  }
  if (const double spin_s = sh.job->spin_s(); spin_s > 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(spin_s);
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        if (pred()) return;
        cpu_relax();
      }
      if (std::chrono::steady_clock::now() > until) break;
    }
  }
  for (int i = 0; i < 4; ++i) {
    if (pred()) return;
    std::this_thread::yield();
  }
  std::unique_lock lock(sh.mu);
  sh.sleepers.fetch_add(1);
  while (!pred()) {
    if (sh.job->aborted()) {
      sh.sleepers.fetch_sub(1);
      lock.unlock();
      throw_aborted(sh);
    }
    sh.cv.wait_for(lock, std::chrono::milliseconds(50));
  }
  sh.sleepers.fetch_sub(1);
}

void wake(LocalShared& sh) {
  if (sh.sleepers.load() > 0) {
    std::lock_guard lock(sh.mu);
    sh.cv.notify_all();
  }
}

void publish(LocalShared& sh, int me, int64_t value) {
  sh.slots[me].progress.store(value);
  wake(sh);
}

void wait_all(LocalShared& sh, int64_t value) {
  wait_until(sh, [&] {
    for (int r = 0; r < sh.n; ++r)
      if (sh.slots[r].progress.load() < value) return false;
    return true;
  });
}

// A data phase (reading the peers' posted buffers): registered, then refused once the job
// aborted, when a peer may already have unwound its buffers (throw_aborted).
struct CopyGuard {
  LocalShared& sh;
  explicit CopyGuard(LocalShared& s) : sh(s) {
    sh.copying.fetch_add(1);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sh.job->aborted()) {
      sh.copying.fetch_sub(1);
      throw_aborted(sh);
    }
  }
  ~CopyGuard() { sh.copying.fetch_sub(1); }
};

// --- reduction in f32, in rank order (bitwise deterministic whatever the timing)

constexpr int64_t kBlock = 2048;

inline void load(float* acc, const void* src, int64_t off, int64_t m, DType dt) {
  if (dt == DType::kF32) {
    std::memcpy(acc, static_cast<const float*>(src) + off, static_cast<size_t>(m) * 4);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(src) + off;
    for (int64_t i = 0; i < m; ++i) {
      uint32_t u = static_cast<uint32_t>(p[i]) << 16;
      std::memcpy(&acc[i], &u, 4);
    }
  }
}

inline void accumulate(float* acc, const void* src, int64_t off, int64_t m, DType dt, ReduceOp op) {
  if (dt == DType::kF32) {
    const float* p = static_cast<const float*>(src) + off;
    if (op == ReduceOp::kMax)
      for (int64_t i = 0; i < m; ++i) acc[i] = std::max(acc[i], p[i]);
    else
      for (int64_t i = 0; i < m; ++i) acc[i] += p[i];
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(src) + off;
    for (int64_t i = 0; i < m; ++i) {
      uint32_t u = static_cast<uint32_t>(p[i]) << 16;
      float x;
      std::memcpy(&x, &u, 4);
      acc[i] = op == ReduceOp::kMax ? std::max(acc[i], x) : acc[i] + x;
    }
  }
}

inline void store(void* dst, const float* acc, int64_t m, DType dt) {
  if (dt == DType::kF32) {
    std::memcpy(dst, acc, static_cast<size_t>(m) * 4);
  } else {
    bf16* p = static_cast<bf16*>(dst);
    for (int64_t i = 0; i < m; ++i) p[i] = f32_to_bf16(acc[i]);
  }
}

// out[i] = reduce over k of ins[k][in_off + i], i in [0, len).
void reduce_range(void* out, const std::vector<const void*>& ins, int64_t in_off, int64_t len,
                  DType dt, ReduceOp op) {
  alignas(64) float acc[kBlock];
  const int n = static_cast<int>(ins.size());
  const int64_t es = dtype_bytes(dt);
  for (int64_t b = 0; b < len; b += kBlock) {
    int64_t m = std::min(kBlock, len - b);
    load(acc, ins[0], in_off + b, m, dt);
    for (int k = 1; k < n; ++k) accumulate(acc, ins[k], in_off + b, m, dt, op);
    if (op == ReduceOp::kAvg) {
      float nf = static_cast<float>(n);
      for (int64_t i = 0; i < m; ++i) acc[i] /= nf;
    }
    store(static_cast<char*>(out) + b * es, acc, m, dt);
  }
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

class P2pWork : public Work {
 public:
  P2pWork(LocalShared* sh, Mailbox* box) : sh_(sh), box_(box) {}
  void finish(std::exception_ptr e) {
    {
      std::lock_guard lock(mu_);
      error_ = e;
      state_.store(e ? 2 : 1, std::memory_order_release);
    }
    cv_.notify_all();
  }
  bool test() override {
    int s = state_.load(std::memory_order_acquire);
    if (s == 2) std::rethrow_exception(error_);
    return s == 1;
  }
  void wait() override {
    for (int i = 0; i < 200; ++i) {
      if (test()) return;
      cpu_relax();
    }
    std::unique_lock lock(mu_);
    while (state_.load(std::memory_order_acquire) == 0) {
      if (sh_->job->aborted()) {
        lock.unlock();
        cancel();
        if (test()) return;
        throw Error(sh_->job->abort_reason(), ExitCode::kRunFailure);
      }
      cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
    lock.unlock();
    test();
  }
  // Takes this request out of its mailbox (under the mailbox lock: no copy is running).
  void cancel() {
    std::lock_guard lock(box_->mu);
    for (auto* q : {&box_->sends, &box_->recvs})
      for (auto it = q->begin(); it != q->end(); ++it)
        if (it->work.get() == this) {
          q->erase(it);
          break;
        }
  }

 private:
  LocalShared* sh_;
  Mailbox* box_;
  std::atomic<int> state_{0};
  std::exception_ptr error_;
  std::mutex mu_;
  std::condition_variable cv_;
};

class LocalBackend : public Backend {
 public:
  LocalBackend(LocalJob& job, std::shared_ptr<LocalShared> sh, int rank)
      : job_(job), sh_(std::move(sh)), me_(rank) {}
  std::string_view kind() const override { return "local"; }
  int rank() const override { return me_; }
  int size() const override { return sh_->n; }

  void run(OpCall& c) override;
  WorkPtr start_p2p(std::shared_ptr<OpCall> call, P2pDone done) override;
  std::unique_ptr<Backend> split(OpCall& call, int color, int key, const std::string& name,
                                 std::vector<int>* world_ranks) override;

 private:
  void post(const OpCall& c);
  void check(const OpCall& c);
  [[noreturn]] void mismatch(const std::string& what);
  int wr(int r) const { return sh_->world_ranks[r]; }

  LocalJob& job_;
  std::shared_ptr<LocalShared> sh_;
  int me_;
};

void LocalBackend::post(const OpCall& c) {
  Slot& s = sh_->slots[me_];
  s.hdr = Header{c.seq, c.op, c.dtype, c.reduce, c.peer, c.tag, c.in_elems, c.out_elems};
  s.counts = c.counts;
  s.recv_counts = c.recv_counts;
  s.in = c.in;
  s.out = c.out;
  publish(*sh_, me_, 3 * c.seq + 1);
  wait_all(*sh_, 3 * c.seq + 1);
}

void LocalBackend::mismatch(const std::string& what) {
  throw Error(fmt::format("collective mismatch on {}: {}", sh_->name, what), ExitCode::kRunFailure);
}

// Every rank runs the same check on the same headers, so all reach the same verdict.
void LocalBackend::check(const OpCall& c) {
  const int n = sh_->n;
  auto key = [&](int r) { return std::make_pair(sh_->slots[r].hdr.op, sh_->slots[r].hdr.seq); };
  bool agree = true;
  for (int r = 1; r < n; ++r) agree = agree && key(r) == key(0);
  if (!agree) {
    // Which op (and sequence number) most ranks are in.
    std::map<std::pair<OpType, int64_t>, int> votes;
    for (int r = 0; r < n; ++r) votes[key(r)]++;
    auto major = std::max_element(votes.begin(), votes.end(), [](auto& a, auto& b) {
                   return a.second < b.second;
                 })->first;
    std::string msg;
    for (int r = 0; r < n; ++r)
      if (key(r) != major)
        msg += fmt::format("{}rank {} is in {} #{} on {}", msg.empty() ? "" : "; ", wr(r),
                           op_name(key(r).first), key(r).second, sh_->name);
    mismatch(fmt::format("{}, the others in {} #{}", msg, op_name(major.first), major.second));
  }
  const Header& h0 = sh_->slots[0].hdr;
  // Formatted only on a mismatch: this check runs on every collective.
  auto what_text = [&] { return fmt::format("{} #{}", op_name(c.op), c.seq); };
  auto list = [&](auto field) {
    std::string s;
    for (int r = 0; r < n; ++r) s += fmt::format("{}rank {}: {}", r ? ", " : "", wr(r), field(r));
    return s;
  };
  for (int r = 1; r < n; ++r) {
    const Header& h = sh_->slots[r].hdr;
    if (h.dtype != h0.dtype)
      mismatch(fmt::format("{}: ranks disagree on the dtype ({}); every rank must pass the same",
                           what_text(),
                           list([&](int k) { return dtype_name(sh_->slots[k].hdr.dtype); })));
    if (h.reduce != h0.reduce && (c.op == OpType::kAllReduce || c.op == OpType::kReduceScatter))
      mismatch(fmt::format("{}: ranks disagree on the reduction ({})", what_text(),
                           list([&](int k) { return reduce_name(sh_->slots[k].hdr.reduce); })));
    if (h.peer != h0.peer && c.op == OpType::kBroadcast)
      mismatch(fmt::format("{}: ranks disagree on the root ({})", what_text(),
                           list([&](int k) { return sh_->slots[k].hdr.peer; })));
    if (h.in_elems != h0.in_elems && (c.op == OpType::kAllReduce || c.op == OpType::kBroadcast ||
                                      c.op == OpType::kReduceScatter))
      mismatch(fmt::format(
          "{}: ranks disagree on the element count ({}); every rank must pass the same count",
          what_text(), list([&](int k) { return sh_->slots[k].hdr.in_elems; })));
    if ((c.op == OpType::kAllGather || c.op == OpType::kReduceScatter) &&
        sh_->slots[r].counts != sh_->slots[0].counts)
      mismatch(fmt::format("{}: ranks disagree on the per-rank counts (rank {} and rank {})",
                           what_text(), wr(0), wr(r)));
  }
  if (c.op == OpType::kAllToAll)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        if (sh_->slots[i].counts[j] != sh_->slots[j].recv_counts[i])
          mismatch(
              fmt::format("{}: rank {} sends {} elems to rank {}, but rank {} expects {} from "
                          "it",
                          what_text(), wr(i), sh_->slots[i].counts[j], wr(j), wr(j),
                          sh_->slots[j].recv_counts[i]));
}

void LocalBackend::run(OpCall& c) {
  LocalShared& sh = *sh_;
  const int n = sh.n;
  const int64_t es = dtype_bytes(c.dtype);
  const int64_t base = 3 * c.seq;
  post(c);
  check(c);
  auto peer_in = [&](int r) { return sh.slots[r].in; };
  auto peer_out = [&](int r) { return static_cast<const char*>(sh.slots[r].out); };
  char* out = static_cast<char*>(c.out);

  switch (c.op) {
    case OpType::kAllReduce: {
      const int64_t E = c.in_elems;
      auto lo = [&](int r) { return E * r / n; };
      const int64_t mine = lo(me_ + 1) - lo(me_);
      {
        CopyGuard g(sh);
        std::vector<const void*> ins(n);
        for (int r = 0; r < n; ++r) ins[r] = peer_in(r);
        reduce_range(out + lo(me_) * es, ins, lo(me_), mine, c.dtype, c.reduce);
      }
      publish(sh, me_, base + 2);
      wait_all(sh, base + 2);
      {
        CopyGuard g(sh);
        for (int r = 0; r < n; ++r)
          if (r != me_)
            std::memcpy(out + lo(r) * es, peer_out(r) + lo(r) * es,
                        static_cast<size_t>((lo(r + 1) - lo(r)) * es));
      }
      // Reduce-scatter: (n-1) chunks of mine in, my others out; all-gather: the reverse.
      c.recv_bytes = ((n - 1) * mine + (E - mine)) * es;
      c.sent_bytes = ((E - mine) + (n - 1) * mine) * es;
      break;
    }
    case OpType::kReduceScatter: {
      auto off = offsets_of(c.counts);
      {
        CopyGuard g(sh);
        std::vector<const void*> ins(n);
        for (int r = 0; r < n; ++r) ins[r] = peer_in(r);
        reduce_range(out, ins, off[me_], c.counts[me_], c.dtype, c.reduce);
      }
      c.recv_bytes = (n - 1) * c.counts[me_] * es;
      c.sent_bytes = (off[n] - c.counts[me_]) * es;
      break;
    }
    case OpType::kAllGather: {
      auto off = offsets_of(c.counts);
      {
        CopyGuard g(sh);
        for (int r = 0; r < n; ++r) {
          const void* src = peer_in(r);
          char* dst = out + off[r] * es;
          if (src != dst) std::memmove(dst, src, static_cast<size_t>(c.counts[r] * es));
        }
      }
      c.recv_bytes = (off[n] - c.counts[me_]) * es;
      c.sent_bytes = (n - 1) * c.counts[me_] * es;
      break;
    }
    case OpType::kBroadcast: {
      const int root = c.peer;
      if (me_ != root) {
        CopyGuard g(sh);
        std::memcpy(out, peer_in(root), static_cast<size_t>(c.in_elems * es));
        c.recv_bytes = c.in_elems * es;
      } else {
        c.sent_bytes = (n - 1) * c.in_elems * es;
      }
      break;
    }
    case OpType::kAllToAll: {
      auto roff = offsets_of(c.recv_counts);
      {
        CopyGuard g(sh);
        for (int r = 0; r < n; ++r) {
          const auto& sc = sh.slots[r].counts;
          int64_t soff = 0;
          for (int k = 0; k < me_; ++k) soff += sc[k];
          std::memcpy(out + roff[r] * es, static_cast<const char*>(peer_in(r)) + soff * es,
                      static_cast<size_t>(sc[me_] * es));
        }
      }
      for (int r = 0; r < n; ++r)
        if (r != me_) {
          c.recv_bytes += c.recv_counts[r] * es;
          c.sent_bytes += c.counts[r] * es;
        }
      break;
    }
    case OpType::kBarrier:
    case OpType::kSplit:
      break;
    default:
      MT_ASSERT(false);
  }
  publish(sh, me_, base + 3);
  wait_all(sh, base + 3);
}

std::unique_ptr<Backend> LocalBackend::split(OpCall& c, int color, int key, const std::string& name,
                                             std::vector<int>* world_ranks) {
  post(c);
  check(c);
  const int n = sh_->n;
  std::vector<std::pair<int, int>> members;  // (key, rank)
  for (int r = 0; r < n; ++r)
    if (sh_->slots[r].hdr.peer == color) members.push_back({sh_->slots[r].hdr.tag, r});
  std::sort(members.begin(), members.end());
  std::unique_ptr<Backend> result;
  if (color >= 0) {
    world_ranks->clear();
    int new_rank = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      world_ranks->push_back(wr(members[i].second));
      if (members[i].second == me_) new_rank = static_cast<int>(i);
    }
    std::string reg_key = fmt::format("{}#{}/{}", sh_->name, c.seq, color);
    result = make_local_backend(job_, job_.shared(reg_key, name, *world_ranks), new_rank);
  }
  publish(*sh_, me_, 3 * c.seq + 3);
  wait_all(*sh_, 3 * c.seq + 3);
  return result;
}

WorkPtr LocalBackend::start_p2p(std::shared_ptr<OpCall> call, P2pDone done) {
  const int n = sh_->n;
  const bool is_send = call->op == OpType::kSend;
  Mailbox& box = sh_->boxes[is_send ? me_ * n + call->peer : call->peer * n + me_];
  auto work = std::make_shared<P2pWork>(sh_.get(), &box);
  std::unique_lock lock(box.mu);
  if (job_.aborted()) throw Error(job_.abort_reason(), ExitCode::kRunFailure);
  auto& other_q = is_send ? box.recvs : box.sends;
  auto it = std::find_if(other_q.begin(), other_q.end(),
                         [&](const P2pReq& r) { return r.call->tag == call->tag; });
  if (it == other_q.end()) {
    (is_send ? box.sends : box.recvs).push_back(P2pReq{call, std::move(done), work});
    return work;
  }
  P2pReq other = std::move(*it);
  other_q.erase(it);
  const OpCall& s = is_send ? *call : *other.call;
  const OpCall& r = is_send ? *other.call : *call;
  std::exception_ptr err;
  if (s.in_elems != r.out_elems || s.dtype != r.dtype) {
    err = std::make_exception_ptr(Error(
        fmt::format("send/recv mismatch on {}: world rank {} sends {} {} elems (tag {}) but world "
                    "rank {} receives {} {} elems",
                    sh_->name, wr(is_send ? me_ : call->peer), s.in_elems, dtype_name(s.dtype),
                    s.tag, wr(is_send ? call->peer : me_), r.out_elems, dtype_name(r.dtype)),
        ExitCode::kRunFailure));
  } else {
    std::memcpy(r.out, s.in, static_cast<size_t>(s.in_elems * dtype_bytes(s.dtype)));
    call->sent_bytes = is_send ? s.in_elems * dtype_bytes(s.dtype) : 0;
    call->recv_bytes = is_send ? 0 : r.out_elems * dtype_bytes(r.dtype);
    other.call->sent_bytes = is_send ? 0 : s.in_elems * dtype_bytes(s.dtype);
    other.call->recv_bytes = is_send ? r.out_elems * dtype_bytes(r.dtype) : 0;
  }
  lock.unlock();
  other.done(*other.call, err);
  other.work->finish(err);
  done(*call, err);
  work->finish(err);
  return work;
}

}  // namespace

LocalJob::LocalJob(int world_size, double timeout_s, double spin_s)
    : Job(timeout_s), world_size_(world_size), spin_s_(spin_s) {}

LocalJob::~LocalJob() { stop_watchdog(); }

std::shared_ptr<LocalShared> LocalJob::shared(const std::string& key, const std::string& name,
                                              const std::vector<int>& world_ranks) {
  std::lock_guard lock(reg_mu_);
  auto& sp = shared_[key];
  if (!sp) {
    sp = std::make_shared<LocalShared>();
    sp->job = this;
    sp->name = name;
    sp->n = static_cast<int>(world_ranks.size());
    sp->world_ranks = world_ranks;
    sp->slots = std::make_unique<Slot[]>(static_cast<size_t>(sp->n));
    sp->boxes = std::make_unique<Mailbox[]>(static_cast<size_t>(sp->n) * sp->n);
  }
  return sp;
}

void LocalJob::on_abort() {
  std::lock_guard lock(reg_mu_);
  for (auto& [k, sp] : shared_) {
    std::lock_guard l2(sp->mu);
    sp->cv.notify_all();
  }
}

std::unique_ptr<Backend> make_local_backend(LocalJob& job, std::shared_ptr<LocalShared> shared,
                                            int rank) {
  return std::make_unique<LocalBackend>(job, std::move(shared), rank);
}

}  // namespace mt::comm
