#include "comm/group.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>

#include "comm/job.h"
#include "comm/simulated_link.h"
#include "comm/staging.h"
#include "core/clock.h"
#include "core/device.h"
#include "core/error.h"

namespace mt::comm {

// An op queued on (or run inline by) a group.
struct Group::Pending : Work {
  std::shared_ptr<OpCall> call;
  int64_t record_id = 0;
  Job* job = nullptr;
  int world_rank = 0;
  std::atomic<int> state{0};  // 0 pending, 1 done, 2 failed
  std::exception_ptr error;
  std::mutex mu;
  std::condition_variable cv;

  void finish(std::exception_ptr e) {
    {
      std::lock_guard lock(mu);
      error = e;
      state.store(e ? 2 : 1, std::memory_order_release);
    }
    cv.notify_all();
  }
  bool test() override {
    int s = state.load(std::memory_order_acquire);
    if (s == 2) std::rethrow_exception(error);
    return s == 1;
  }
  // Returns (or throws) only once the op ended: until then its buffers are in use, by the
  // progress thread and by the peers. After an abort the backend fails it promptly (a queued
  // op never starts); a rank that does not unwind at all is launch's grace period's to end.
  void wait() override {
    for (int i = 0; i < 64; ++i) {
      if (test()) return;
      std::this_thread::yield();
    }
    settle();
    test();
  }
  void settle() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return state.load(std::memory_order_acquire) != 0; });
  }
};

// The group's progress thread: runs queued ops in order.
struct Group::Worker {
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Pending>> queue;
  bool busy = false;
  bool stop = false;
  // Ops queued and not yet finished. Only the group's one calling thread queues, so a
  // blocking call that reads 0 has nothing ahead of it and runs inline without taking mu
  // (the decrement after an op's execute releases its effects to that reader).
  std::atomic<int64_t> outstanding{0};
};

Group::Group(std::shared_ptr<RankContext> ctx, std::unique_ptr<Backend> backend, std::string name,
             std::vector<int> world_ranks)
    : ctx_(std::move(ctx)),
      backend_(std::move(backend)),
      name_(std::move(name)),
      world_ranks_(std::move(world_ranks)),
      rank_(backend_->rank()),
      size_(backend_->size()),
      tracker_(&mem::current_tracker()),
      worker_(std::make_unique<Worker>()) {
  if (ctx_->job) ctx_->job->register_group(name_, world_ranks_);
}

Group::~Group() {
  forget_simulated_link(*this);
  {
    std::lock_guard lock(worker_->mu);
    worker_->stop = true;
  }
  worker_->cv.notify_all();
  if (worker_->thread.joinable()) worker_->thread.join();
}

std::shared_ptr<OpCall> Group::make_call(OpType op, Buf in, Buf out) {
  if (in.ptr && out.ptr && in.dtype != out.dtype)
    fail("{} on {}: input is {} but output is {}; both must have one dtype", op_name(op), name_,
         dtype_name(in.dtype), dtype_name(out.dtype));
  if (in.ptr && out.ptr && in.device != out.device)
    fail("{} on {}: input is on the {} but output on the {}; both must be on one device",
         op_name(op), name_, in.device == mem::Device::kCpu ? "CPU" : "GPU",
         out.device == mem::Device::kCpu ? "CPU" : "GPU");
  const mem::Device dev = in.ptr ? in.device : out.device;
  if (dev == mem::Device::kCuda && !device::on_cuda())
    fail(
        "{} on {}: the buffer is on a GPU but this thread computes on the CPU; call "
        "device::use_cuda on the rank thread first (its stream orders the op)",
        op_name(op), name_);
  // Collectives run one at a time from the rank's thread (their sequence numbers say so):
  // their call reuses the last one once nothing else holds it, keeping the counts' capacity,
  // so a blocking collective allocates nothing (MoE's dispatch runs several per layer).
  // Send and recv may come from other threads: always a new call.
  std::shared_ptr<OpCall> c;
  if (op != OpType::kSend && op != OpType::kRecv && spare_call_ && spare_call_.use_count() == 1) {
    c = spare_call_;
    std::vector<int64_t> counts = std::move(c->counts), recv_counts = std::move(c->recv_counts);
    *c = OpCall{};
    counts.clear();
    recv_counts.clear();
    c->counts = std::move(counts);
    c->recv_counts = std::move(recv_counts);
  } else {
    c = std::make_shared<OpCall>();
    if (op != OpType::kSend && op != OpType::kRecv) spare_call_ = c;
  }
  c->op = op;
  c->dtype = in.ptr ? in.dtype : out.dtype;
  c->device = dev;
  // The calling thread's stream, captured now: the op may run later on the progress thread.
  if (device::on_cuda()) {
    c->cuda_device = device::current_index();
    c->cuda_stream = device::cuda_stream();
  }
  c->in = in.ptr;
  c->out = out.ptr;
  c->in_elems = in.elems;
  c->out_elems = out.elems;
  return c;
}

int64_t Group::record(const OpCall& c, bool started) {
  FlightRecorder::Start s;
  s.group = &name_;
  s.op = c.op;
  s.seq = c.seq;
  s.dtype = c.dtype;
  s.elems = c.op == OpType::kRecv ? c.out_elems : c.in_elems;
  s.peer = c.peer;
  s.tag = c.tag;
  s.started = started;
  s.at = now_s();
  return ctx_->recorder.on_queued(s);
}

void Group::execute(Pending& p) {
  ctx_->recorder.on_started(p.record_id);
  try {
    // An op still queued when the job aborted never starts (its buffers may be gone).
    if (ctx_->job && ctx_->job->aborted())
      throw Error(ctx_->job->abort_reason(), ExitCode::kRunFailure);
    run_over_link(*p.call);
  } catch (...) {
    ctx_->recorder.on_failed(p.record_id);
    p.finish(std::current_exception());
    return;
  }
  ctx_->recorder.on_done(p.record_id, p.call->sent_bytes, p.call->recv_bytes);
  p.finish(nullptr);
}

// A simulated link (comm/simulated_link.h): the op lasts at least the link's time.
void Group::run_over_link(OpCall& c) {
  if (!any_simulated_link()) {
    run_call(c);
    return;
  }
  const double t0 = now_s();
  run_call(c);
  const double link = simulated_link_s(*this, c.op, size_, c.recv_bytes);
  if (link > 0) {
    const double left = t0 + link - now_s();
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
  }
}

void Group::run_call(OpCall& c) {
  if (c.device == mem::Device::kCuda && backend_->kind() != "nccl") {
    if (!staging_) staging_ = std::make_unique<HostStaging>(*tracker_);
    staging_->run(*backend_, c);
    return;
  }
  backend_->run(c);
}

WorkPtr Group::submit(std::shared_ptr<OpCall> call, bool async) {
  if (ctx_->job && ctx_->job->aborted())
    throw Error(ctx_->job->abort_reason(), ExitCode::kRunFailure);
  call->seq = next_seq_++;
  if (async && call->device == mem::Device::kCuda) call->cuda_ready = device::record_event();
  Worker& w = *worker_;
  if (!async && w.outstanding.load(std::memory_order_acquire) == 0) {
    // Nothing ahead of it: run on the caller's thread, queued and started at once. No
    // Pending: the caller waits by running it, and a failure is thrown from here.
    const int64_t id = record(*call, /*started=*/true);
    try {
      if (ctx_->job && ctx_->job->aborted())
        throw Error(ctx_->job->abort_reason(), ExitCode::kRunFailure);
      run_over_link(*call);
    } catch (...) {
      ctx_->recorder.on_failed(id);
      throw;
    }
    ctx_->recorder.on_done(id, call->sent_bytes, call->recv_bytes);
    return WorkPtr{};  // (only the blocking forms get here, and they drop the handle)
  }
  auto p = std::make_shared<Pending>();
  call->async = async;
  p->call = std::move(call);
  p->job = ctx_->job;
  p->world_rank = ctx_->world_rank;
  p->record_id = record(*p->call, /*started=*/false);
  {
    std::unique_lock lock(w.mu);
    w.outstanding.fetch_add(1, std::memory_order_relaxed);
    w.queue.push_back(p);
    if (!w.thread.joinable()) {
      w.thread = std::thread([this] {
        Worker& wk = *worker_;
        mem::ScopedTracker scope(*tracker_);
        std::unique_lock lk(wk.mu);
        for (;;) {
          wk.cv.wait(lk, [&] { return wk.stop || !wk.queue.empty(); });
          if (wk.queue.empty()) return;  // stop
          auto next = wk.queue.front();
          wk.queue.pop_front();
          wk.busy = true;
          lk.unlock();
          execute(*next);
          lk.lock();
          wk.busy = false;
          wk.outstanding.fetch_sub(1, std::memory_order_release);
        }
      });
    }
  }
  w.cv.notify_one();
  if (!async) {
    p->wait();
    return p;
  }
  // The caller's handle. Dropped before the op ended (an exception unwinding the object that
  // owns both the handle and the buffers, while the progress thread or a peer still uses
  // them), it waits for the op first, as std::async's future does.
  return WorkPtr(p.get(), [p](Work*) {
    if (p->state.load(std::memory_order_acquire) != 0) return;
    // The rank fails: the op ends when the job does (mpi: the process ends soon anyway).
    if (Job* job = p->job; job && !job->aborted() && std::uncaught_exceptions() > 0)
      if (!job->abort_unwinding(p->world_rank)) return;
    p->settle();
  });
}

WorkPtr Group::submit_p2p(std::shared_ptr<OpCall> call) {
  if (ctx_->job && ctx_->job->aborted())
    throw Error(ctx_->job->abort_reason(), ExitCode::kRunFailure);
  if (call->device == mem::Device::kCuda && backend_->kind() != "nccl")
    return staged_p2p(std::move(call),
                      [this](std::shared_ptr<OpCall> c) { return submit_p2p(std::move(c)); });
  {
    std::lock_guard lock(p2p_mu_);
    int64_t& s = p2p_seq_[{call->peer, call->op == OpType::kSend ? 0 : 1}];
    call->seq = ++s;
  }
  int64_t id = record(*call, /*started=*/false);
  ctx_->recorder.on_started(id);
  std::shared_ptr<RankContext> ctx = ctx_;
  return backend_->start_p2p(call, [ctx, id](const OpCall& c, std::exception_ptr e) {
    if (e)
      ctx->recorder.on_failed(id);
    else
      ctx->recorder.on_done(id, c.sent_bytes, c.recv_bytes);
  });
}

void Group::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_)
    fail("{} on {}: rank {} is not in the group (it has ranks 0..{})", what, name_, peer,
         size_ - 1);
}

namespace {
// Marks the calls made while it lives as the equal-pieces forms (backends may use MPI's
// equal-count calls: every rank of the group made the same kind of call).
// Sets a flag of the group for the duration of a call (equal pieces; blocking submission).
struct Flag {
  bool& flag;
  bool before;
  explicit Flag(bool& f) : flag(f), before(f) { flag = true; }
  ~Flag() { flag = before; }
};
int64_t sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}
}  // namespace

// --- async forms: check the arguments (bad input, before any work), then submit.

// The backends reduce f32 and bf16 (accumulating in f32); an i32 buffer (token ids) is
// moved, never reduced: read as bf16 it would come back as garbage.
void Group::refuse_integer_reduction(const char* what, Buf in) const {
  if (in.ptr && in.dtype == DType::kI32)
    fail(
        "{} on {}: the buffer is {}; reductions take f32 or bf16 (convert, or move it with "
        "all_gather / broadcast)",
        what, name_, dtype_name(in.dtype));
}

WorkPtr Group::all_reduce_async(Buf data, ReduceOp op) { return all_reduce_async(data, data, op); }

WorkPtr Group::all_reduce_async(Buf in, Buf out, ReduceOp op) {
  if (in.elems != out.elems)
    fail("all_reduce on {}: input has {} elems but output {}; they must be equal", name_, in.elems,
         out.elems);
  refuse_integer_reduction("all_reduce", in);
  auto c = make_call(OpType::kAllReduce, in, out);
  c->reduce = op;
  return submit(std::move(c), !blocking_);
}

WorkPtr Group::reduce_scatter_async(Buf in, Buf out, ReduceOp op) {
  Flag mark(equal_pieces_);
  if (in.elems != out.elems * size_)
    fail("reduce_scatter on {}: input has {} elems but must have size {} x output {} = {}", name_,
         in.elems, size_, out.elems, out.elems * size_);
  return reduce_scatter_async(in, out, std::vector<int64_t>(size_, out.elems), op);
}

WorkPtr Group::reduce_scatter_async(Buf in, Buf out, const std::vector<int64_t>& counts,
                                    ReduceOp op) {
  if (static_cast<int>(counts.size()) != size_)
    fail("reduce_scatter on {}: {} counts given for {} ranks", name_, counts.size(), size_);
  if (sum(counts) != in.elems || counts[rank_] != out.elems)
    fail(
        "reduce_scatter on {}: counts sum to {} (input has {}), this rank's count is {} "
        "(output has {})",
        name_, sum(counts), in.elems, counts[rank_], out.elems);
  refuse_integer_reduction("reduce_scatter", in);
  auto c = make_call(OpType::kReduceScatter, in, out);
  c->reduce = op;
  c->counts = counts;
  c->equal_pieces = equal_pieces_;
  return submit(std::move(c), !blocking_);
}

WorkPtr Group::all_gather_async(Buf in, Buf out) {
  Flag mark(equal_pieces_);
  if (out.elems != in.elems * size_)
    fail("all_gather on {}: output has {} elems but must have size {} x input {} = {}", name_,
         out.elems, size_, in.elems, in.elems * size_);
  return all_gather_async(in, out, std::vector<int64_t>(size_, in.elems));
}

WorkPtr Group::all_gather_async(Buf in, Buf out, const std::vector<int64_t>& counts) {
  if (static_cast<int>(counts.size()) != size_)
    fail("all_gather on {}: {} counts given for {} ranks", name_, counts.size(), size_);
  if (sum(counts) != out.elems || counts[rank_] != in.elems)
    fail(
        "all_gather on {}: counts sum to {} (output has {}), this rank's count is {} (input "
        "has {})",
        name_, sum(counts), out.elems, counts[rank_], in.elems);
  auto c = make_call(OpType::kAllGather, in, out);
  c->counts = counts;
  c->equal_pieces = equal_pieces_;
  return submit(std::move(c), !blocking_);
}

WorkPtr Group::broadcast_async(Buf data, int root) {
  check_peer(root, "broadcast");
  auto c = make_call(OpType::kBroadcast, data, data);
  c->peer = root;
  return submit(std::move(c), !blocking_);
}

WorkPtr Group::all_to_all_async(Buf in, Buf out) {
  Flag mark(equal_pieces_);
  if (in.elems != out.elems || in.elems % size_ != 0)
    fail(
        "all_to_all on {}: input ({} elems) and output ({} elems) must be equal and divisible "
        "by the group size {}",
        name_, in.elems, out.elems, size_);
  std::vector<int64_t> counts(size_, in.elems / size_);
  return all_to_all_async(in, out, counts, counts);
}

WorkPtr Group::all_to_all_async(Buf in, Buf out, const std::vector<int64_t>& send_counts,
                                const std::vector<int64_t>& recv_counts) {
  if (static_cast<int>(send_counts.size()) != size_ ||
      static_cast<int>(recv_counts.size()) != size_)
    fail("all_to_all on {}: {} send counts and {} recv counts given for {} ranks", name_,
         send_counts.size(), recv_counts.size(), size_);
  if (sum(send_counts) != in.elems || sum(recv_counts) != out.elems)
    fail(
        "all_to_all on {}: send counts sum to {} (input has {}), recv counts to {} (output has "
        "{})",
        name_, sum(send_counts), in.elems, sum(recv_counts), out.elems);
  if (in.ptr && in.ptr == out.ptr && size_ > 1)
    fail(
        "all_to_all on {}: input and output are the same buffer; in place is not supported, "
        "use two buffers",
        name_);
  auto c = make_call(OpType::kAllToAll, in, out);
  c->counts = send_counts;
  c->recv_counts = recv_counts;
  c->equal_pieces = equal_pieces_;
  return submit(std::move(c), !blocking_);
}

WorkPtr Group::barrier_async() {
  return submit(make_call(OpType::kBarrier, Buf{}, Buf{}), !blocking_);
}

WorkPtr Group::send_async(Buf data, int peer, int tag) {
  check_peer(peer, "send");
  auto c = make_call(OpType::kSend, data, Buf{});
  c->peer = peer;
  c->tag = tag;
  return submit_p2p(std::move(c));
}

WorkPtr Group::recv_async(Buf data, int peer, int tag) {
  check_peer(peer, "recv");
  auto c = make_call(OpType::kRecv, Buf{}, data);
  c->peer = peer;
  c->tag = tag;
  return submit_p2p(std::move(c));
}

// --- blocking forms: the async form, submitted blocking (run inline when nothing is queued
// ahead of it); the checks and the call are built in one place.

void Group::all_reduce(Buf data, ReduceOp op) { all_reduce(data, data, op); }
void Group::all_reduce(Buf in, Buf out, ReduceOp op) {
  Flag mark(blocking_);
  all_reduce_async(in, out, op);
}
void Group::reduce_scatter(Buf in, Buf out, ReduceOp op) {
  Flag mark(blocking_);
  reduce_scatter_async(in, out, op);
}
void Group::reduce_scatter(Buf in, Buf out, const std::vector<int64_t>& counts, ReduceOp op) {
  Flag mark(blocking_);
  reduce_scatter_async(in, out, counts, op);
}
void Group::all_gather(Buf in, Buf out) {
  Flag mark(blocking_);
  all_gather_async(in, out);
}
void Group::all_gather(Buf in, Buf out, const std::vector<int64_t>& counts) {
  Flag mark(blocking_);
  all_gather_async(in, out, counts);
}
void Group::broadcast(Buf data, int root) {
  Flag mark(blocking_);
  broadcast_async(data, root);
}
void Group::all_to_all(Buf in, Buf out) {
  Flag mark(blocking_);
  all_to_all_async(in, out);
}
void Group::all_to_all(Buf in, Buf out, const std::vector<int64_t>& send_counts,
                       const std::vector<int64_t>& recv_counts) {
  Flag mark(blocking_);
  all_to_all_async(in, out, send_counts, recv_counts);
}

std::vector<int64_t> Group::exchange_counts(const std::vector<int64_t>& send_counts) {
  if (static_cast<int>(send_counts.size()) != size_)
    fail("exchange_counts on {}: {} send counts given for {} ranks", name_, send_counts.size(),
         size_);
  // Each count as two i32 halves (low, high): the transport moves bits, never converts.
  std::vector<int32_t> mine(2 * static_cast<size_t>(size_)), theirs(mine.size());
  for (size_t r = 0; r < send_counts.size(); ++r) {
    if (send_counts[r] < 0)
      fail("exchange_counts on {}: send count {} to rank {} is negative", name_, send_counts[r], r);
    const auto u = static_cast<uint64_t>(send_counts[r]);
    mine[2 * r] = static_cast<int32_t>(static_cast<uint32_t>(u));
    mine[2 * r + 1] = static_cast<int32_t>(static_cast<uint32_t>(u >> 32));
  }
  const auto n = static_cast<int64_t>(mine.size());
  all_to_all(Buf(mine.data(), n, DType::kI32), Buf(theirs.data(), n, DType::kI32));
  std::vector<int64_t> recv(static_cast<size_t>(size_));
  for (size_t r = 0; r < recv.size(); ++r)
    recv[r] =
        static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(theirs[2 * r])) |
                             static_cast<uint64_t>(static_cast<uint32_t>(theirs[2 * r + 1])) << 32);
  return recv;
}

void Group::barrier() {
  Flag mark(blocking_);
  barrier_async();
}

void Group::send(Buf data, int peer, int tag) { send_async(data, peer, tag)->wait(); }
void Group::recv(Buf data, int peer, int tag) { recv_async(data, peer, tag)->wait(); }

void Group::send_recv(Buf send_data, int dst, Buf recv_data, int src, int tag) {
  WorkPtr s = send_async(send_data, dst, tag);
  WorkPtr r = recv_async(recv_data, src, tag);
  r->wait();
  s->wait();
}

std::unique_ptr<Group> Group::split(int color, int key, const std::string& name) {
  // A collective of this group: it takes a sequence number and is recorded like the others.
  auto call = make_call(OpType::kSplit, Buf{}, Buf{});
  call->peer = color;
  call->tag = key;
  // Let earlier async ops of this group finish first, so that the split keeps call order.
  for (;;) {
    std::unique_lock lock(worker_->mu);
    if (worker_->queue.empty() && !worker_->busy) break;
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (ctx_->job && ctx_->job->aborted())
    throw Error(ctx_->job->abort_reason(), ExitCode::kRunFailure);
  call->seq = next_seq_++;
  int64_t id = record(*call, /*started=*/false);
  ctx_->recorder.on_started(id);
  std::vector<int> members;
  std::unique_ptr<Backend> b;
  try {
    b = backend_->split(*call, color, key, name, &members);
  } catch (...) {
    ctx_->recorder.on_failed(id);
    throw;
  }
  ctx_->recorder.on_done(id, 0, 0);
  if (!b) return nullptr;
  return std::make_unique<Group>(ctx_, std::move(b), name, std::move(members));
}

}  // namespace mt::comm
