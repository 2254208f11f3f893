// The nccl backend (nccl_backend.h; docs/comm.md, "The NCCL backend").
#include "comm/nccl/nccl_backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/job.h"
#include "core/device.h"
#include "core/error.h"

namespace mt::comm {

namespace {

static_assert(sizeof(ncclUniqueId) == 128, "the bootstrap broadcasts 128 bytes");

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fail_run("nccl backend: {} failed: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm) {
  if (r == ncclSuccess) return;
  const char* last = ncclGetLastError(comm);
  fail_run("nccl backend: {} failed: {}{}{}", what, ncclGetErrorString(r),
           last && *last ? ": " : "", last ? last : "");
}

// Every DType: an i32 buffer (token ids) mapped to a 2-byte type would move half its bytes.
ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
  }
  MT_ASSERT(false);
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

size_t sz(int64_t v) { return static_cast<size_t>(v); }

// ncclGroupStart .. ncclGroupEnd; a throw in between still closes the group (NCCL's group
// state is the thread's: left open, it would swallow the thread's next NCCL call).
class NcclGroupScope {
 public:
  explicit NcclGroupScope(ncclComm_t comm) : comm_(comm) {
    check_nccl(ncclGroupStart(), "ncclGroupStart", comm_);
    open_ = true;
  }
  ~NcclGroupScope() {
    if (open_) (void)ncclGroupEnd();
  }
  void end() {
    open_ = false;
    check_nccl(ncclGroupEnd(), "ncclGroupEnd", comm_);
  }

 private:
  ncclComm_t comm_;
  bool open_ = false;
};

// One ncclGroup of send/recv calls: every op of it completes when `done` has.
struct P2pBatch {
  cudaEvent_t done = nullptr;
  ~P2pBatch() {
    if (done) (void)cudaEventDestroy(done);
  }
};

class NcclBackend;

class NcclP2pWork : public Work {
 public:
  NcclP2pWork(NcclBackend* b, std::shared_ptr<OpCall> c, P2pDone d)
      : call(std::move(c)), backend_(b), done_(std::move(d)) {}
  ~NcclP2pWork() override {
    if (ready) (void)cudaEventDestroy(ready);
  }
  bool test() override;
  void wait() override;
  bool poll() override;

  std::shared_ptr<OpCall> call;
  cudaEvent_t ready = nullptr;  // on the issuing stream at the call: the data is ready
  // Set by the backend under its p2p mutex when the op is handed to NCCL (or fails to be).
  std::shared_ptr<P2pBatch> batch;
  std::exception_ptr issue_error;

 private:
  void finish(std::exception_ptr e);
  bool rethrow() {
    if (error_) std::rethrow_exception(error_);
    return true;
  }
  NcclBackend* backend_;
  P2pDone done_;
  bool finished_ = false;
  std::exception_ptr error_;
};

class NcclBackend final : public Backend {
 public:
  NcclBackend(ncclComm_t comm, std::unique_ptr<Group> host_group,
              std::unique_ptr<Backend> host_owned, std::string name, int device, Job* job,
              int world_rank);
  ~NcclBackend() override;
  std::string_view kind() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void run(OpCall& c) override;
  WorkPtr start_p2p(std::shared_ptr<OpCall> call, P2pDone done) override;
  std::unique_ptr<Backend> split(OpCall& call, int color, int key, const std::string& name,
                                 std::vector<int>* world_ranks) override;

  // --- for NcclP2pWork
  // Hands every started send/recv to NCCL as one group (so that sends and receives that
  // need each other progress together: NCCL has no buffered sends). Returns w's batch.
  std::shared_ptr<P2pBatch> issued_batch(NcclP2pWork& w);
  bool issued(const NcclP2pWork& w) {
    std::lock_guard lock(p2p_mu_);
    return w.batch || w.issue_error;
  }
  // Waits on the host for `ev`; throws on a CUDA error, an asynchronous NCCL error or the
  // job's abort.
  void wait_event(cudaEvent_t ev, bool p2p, const std::string& what);
  bool query_event(cudaEvent_t ev, bool p2p, const std::string& what);
  const std::string& name() const { return name_; }

 private:
  void check_usable(bool p2p, const std::string& what);
  void flush_p2p_locked();
  void enqueue(OpCall& c);
  char* scratch(int64_t bytes);
  void abort_comms();
  void release(bool abort);

  ncclComm_t comm_ = nullptr;      // collectives (run on the group's calling or progress thread)
  ncclComm_t p2p_comm_ = nullptr;  // send/recv (issued from the rank thread): a thread each
  cudaStream_t stream_ = nullptr, p2p_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;  // collectives run one at a time: reused
  std::unique_ptr<Group> host_group_;             // the world's host twin
  std::unique_ptr<Backend> host_owned_;           // a split group's host twin
  Backend* host_ = nullptr;
  std::string name_;
  int dev_ = 0, world_rank_ = 0, rank_ = 0, size_ = 1;
  Job* job_ = nullptr;
  int hook_ = 0;
  std::atomic<bool> aborted_{false};
  mem::Block scratch_;  // device memory for uneven reduce_scatter and barrier; grown only
  // The tracker current when the group was made (it outlives the group); scratch_ is counted
  // against it, not against the caller's, which may be scoped to fn and gone when ~NcclBackend
  // frees the block.
  mem::Tracker* tracker_ = nullptr;
  std::mutex p2p_mu_;
  std::vector<std::shared_ptr<NcclP2pWork>> pending_;  // started, not yet handed to NCCL
};

NcclBackend::NcclBackend(ncclComm_t comm, std::unique_ptr<Group> host_group,
                         std::unique_ptr<Backend> host_owned, std::string name, int device,
                         Job* job, int world_rank)
    : comm_(comm),
      host_group_(std::move(host_group)),
      host_owned_(std::move(host_owned)),
      name_(std::move(name)),
      dev_(device),
      world_rank_(world_rank),
      job_(job),
      tracker_(&mem::current_tracker()) {
  host_ = host_group_ ? &host_group_->backend() : host_owned_.get();
  MT_ASSERT(host_ != nullptr && comm_ != nullptr);
  rank_ = host_->rank();
  size_ = host_->size();
  try {
    check_cuda(cudaSetDevice(dev_), "cudaSetDevice");
    int nccl_rank = -1, nccl_size = 0;
    check_nccl(ncclCommUserRank(comm_, &nccl_rank), "ncclCommUserRank", comm_);
    check_nccl(ncclCommCount(comm_, &nccl_size), "ncclCommCount", comm_);
    if (nccl_rank != rank_ || nccl_size != size_)
      fail_run(
          "nccl backend: group {}: NCCL makes this rank {} of {} but the host group {} of {}; "
          "the two splits ordered the ranks differently",
          name_, nccl_rank, nccl_size, rank_, size_);
    // A second communicator for send/recv: they are issued from the rank thread while the
    // progress thread may be issuing collectives, and NCCL wants one thread per communicator.
    check_nccl(ncclCommSplit(comm_, 0, rank_, &p2p_comm_, nullptr), "ncclCommSplit (send/recv)",
               comm_);
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaStreamCreateWithFlags(&p2p_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  } catch (...) {
    release(true);
    throw;
  }
  // On a job abort (watchdog, a failed rank) end our kernels that wait for peers.
  if (job_) hook_ = job_->add_abort_hook([this] { abort_comms(); });
}

NcclBackend::~NcclBackend() {
  if (job_ && hook_) job_->remove_abort_hook(hook_);
  // Unwinding (this rank failed) or aborted: peers may never come; do not wait for them.
  bool abort = aborted_ || std::uncaught_exceptions() > 0 || (job_ && job_->aborted());
  if (!abort) {
    try {
      {
        std::lock_guard lock(p2p_mu_);
        flush_p2p_locked();
      }
      check_cuda(cudaSetDevice(dev_), "cudaSetDevice");
      check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
      wait_event(done_, false, "the last collectives");
      check_cuda(cudaEventRecord(done_, p2p_stream_), "cudaEventRecord");
      wait_event(done_, true, "the last send/recv");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] nccl backend: group %s: %s (aborting its communicators)\n",
                   world_rank_, name_.c_str(), e.what());
      abort = true;
    }
  }
  release(abort);
}

void NcclBackend::release(bool abort) {
  (void)cudaSetDevice(dev_);
  if (!aborted_.exchange(true)) {
    for (ncclComm_t* c : {&p2p_comm_, &comm_})
      if (*c) {
        ncclResult_t r = abort ? ncclCommAbort(*c) : ncclCommDestroy(*c);
        if (r != ncclSuccess)
          std::fprintf(stderr, "[rank %d] nccl backend: group %s: %s failed: %s\n", world_rank_,
                       name_.c_str(), abort ? "ncclCommAbort" : "ncclCommDestroy",
                       ncclGetErrorString(r));
        *c = nullptr;
      }
  }
  for (cudaEvent_t* e : {&ready_, &done_})
    if (*e) (void)cudaEventDestroy(std::exchange(*e, nullptr));
  for (cudaStream_t* s : {&stream_, &p2p_stream_})
    if (*s) (void)cudaStreamDestroy(std::exchange(*s, nullptr));
  mem::release(scratch_);
}

void NcclBackend::abort_comms() {
  // Called from the thread that aborts the job while this rank's threads may be waiting in
  // wait_event: they see aborted_ (or the job's abort) and throw; the communicators are
  // aborted here, which ends NCCL kernels still waiting for a peer.
  if (aborted_.exchange(true)) return;
  (void)cudaSetDevice(dev_);
  for (ncclComm_t c : {p2p_comm_, comm_})
    if (c) (void)ncclCommAbort(c);
}

void NcclBackend::check_usable(bool p2p, const std::string& what) {
  if (job_ && job_->aborted()) throw Error(job_->abort_reason(), ExitCode::kRunFailure);
  if (aborted_)
    fail_run("{} on {}: the NCCL communicator was aborted (the job is ending)", what, name_);
  ncclComm_t comm = p2p ? p2p_comm_ : comm_;
  ncclResult_t async = ncclSuccess;
  check_nccl(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError", comm);
  if (async != ncclSuccess && async != ncclInProgress) {
    const char* last = ncclGetLastError(comm);
    fail_run("{} on {}: NCCL reports an asynchronous error: {}{}{}", what, name_,
             ncclGetErrorString(async), last && *last ? ": " : "", last ? last : "");
  }
}

bool NcclBackend::query_event(cudaEvent_t ev, bool p2p, const std::string& what) {
  const cudaError_t q = cudaEventQuery(ev);
  if (q == cudaSuccess) return true;
  if (q != cudaErrorNotReady) check_cuda(q, "cudaEventQuery");
  check_usable(p2p, what);
  return false;
}

void NcclBackend::wait_event(cudaEvent_t ev, bool p2p, const std::string& what) {
  // Spin a little, then sleep: ranks may share cores (DESIGN.md).
  for (int i = 0;; ++i) {
    if (query_event(ev, p2p, what)) return;
    if (i < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(i < 2000 ? 20 : 500));
  }
}

char* NcclBackend::scratch(int64_t bytes) {
  if (scratch_.bytes < bytes) {
    // cudaFree waits for the device: earlier ops on stream_ are done with the old block.
    mem::release(scratch_);
    mem::ScopedTracker scope(*tracker_);
    scratch_ = mem::allocate(bytes, mem::Category::kCommunication, mem::Device::kCuda);
  }
  return static_cast<char*>(scratch_.ptr);
}

void NcclBackend::run(OpCall& c) {
  const std::string what = fmt::format("{} #{}", op_name(c.op), c.seq);
  check_usable(false, what);
  // A send started before this collective must not wait for the group's next p2p wait
  // (its peer may need it to reach this collective).
  {
    std::lock_guard lock(p2p_mu_);
    flush_p2p_locked();
  }
  if (c.op != OpType::kBarrier && c.device != mem::Device::kCuda) {
    host_->run(c);  // host memory (scalars): the host twin, exact and blocking
    return;
  }
  check_cuda(cudaSetDevice(dev_), "cudaSetDevice");
  // The stream of the rank that made the call (captured then; this may be the progress
  // thread): the op waits for what the rank queued before the call, and the rank's later
  // work waits for the op. No host wait.
  auto user = static_cast<cudaStream_t>(c.cuda_stream);
  cudaEvent_t ready = static_cast<cudaEvent_t>(c.cuda_ready.get());  // an async op's, from the call
  if (!ready) {
    ready = ready_;
    check_cuda(cudaEventRecord(ready, user), "cudaEventRecord (the calling rank's stream)");
  }
  check_cuda(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent (comm stream)");
  enqueue(c);
  check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord (comm stream)");
  check_cuda(cudaStreamWaitEvent(user, done_, 0),
             "cudaStreamWaitEvent (the calling rank's stream)");
  // A barrier is a host-visible point: wait until every rank's earlier GPU work got here.
  if (c.op == OpType::kBarrier) wait_event(done_, false, what);
}

void NcclBackend::enqueue(OpCall& c) {
  const int n = size_, me = rank_;
  const int64_t es = dtype_bytes(c.dtype);
  const ncclDataType_t dt = nccl_type(c.dtype);
  const auto* in = static_cast<const char*>(c.in);
  auto* out = static_cast<char*>(c.out);
  auto d2d = [&](void* dst, const void* src, int64_t elems) {
    if (elems > 0 && dst != src)
      check_cuda(cudaMemcpyAsync(dst, src, sz(elems * es), cudaMemcpyDeviceToDevice, stream_),
                 "cudaMemcpyAsync (device to device)");
  };
  switch (c.op) {
    case OpType::kAllReduce: {
      const int64_t E = c.in_elems;
      if (E > 0)
        check_nccl(ncclAllReduce(in, out, sz(E), dt, nccl_op(c.reduce), comm_, stream_),
                   "ncclAllReduce", comm_);
      // The ring's volume, as local and mpi count it (docs/comm.md).
      const int64_t mine = E * (me + 1) / n - E * me / n;
      c.sent_bytes = c.recv_bytes = ((n - 1) * mine + (E - mine)) * es;
      break;
    }
    case OpType::kReduceScatter: {
      const auto off = offsets_of(c.counts);
      const int64_t mine = c.counts[sz(me)];
      if (c.equal_pieces) {
        if (mine > 0)
          check_nccl(ncclReduceScatter(in, out, sz(mine), dt, nccl_op(c.reduce), comm_, stream_),
                     "ncclReduceScatter", comm_);
      } else {
        // Uneven pieces: pad every piece to the largest into scratch (piece r at r * m), one
        // equal-piece reduce-scatter into the scratch's tail, then this rank's count out.
        // The padding is never read into a kept element.
        const int64_t m = *std::max_element(c.counts.begin(), c.counts.end());
        if (m > 0) {
          char* s = scratch((n + 1) * m * es);
          for (int r = 0; r < n; ++r) d2d(s + r * m * es, in + off[sz(r)] * es, c.counts[sz(r)]);
          check_nccl(
              ncclReduceScatter(s, s + n * m * es, sz(m), dt, nccl_op(c.reduce), comm_, stream_),
              "ncclReduceScatter (padded uneven pieces)", comm_);
          d2d(out, s + n * m * es, mine);
        }
      }
      c.recv_bytes = (n - 1) * mine * es;
      c.sent_bytes = (off[sz(n)] - mine) * es;
      break;
    }
    case OpType::kAllGather: {
      const auto off = offsets_of(c.counts);
      const int64_t mine = c.counts[sz(me)];
      if (c.equal_pieces) {
        if (mine > 0)
          check_nccl(ncclAllGather(in, out, sz(mine), dt, comm_, stream_), "ncclAllGather", comm_);
      } else {
        d2d(out + off[sz(me)] * es, in, mine);
        NcclGroupScope g(comm_);
        for (int r = 0; r < n; ++r) {
          if (r == me) continue;
          if (mine > 0)
            check_nccl(ncclSend(in, sz(mine), dt, r, comm_, stream_), "ncclSend (all_gather)",
                       comm_);
          if (c.counts[sz(r)] > 0)
            check_nccl(ncclRecv(out + off[sz(r)] * es, sz(c.counts[sz(r)]), dt, r, comm_, stream_),
                       "ncclRecv (all_gather)", comm_);
        }
        g.end();
      }
      c.recv_bytes = (off[sz(n)] - mine) * es;
      c.sent_bytes = (n - 1) * mine * es;
      break;
    }
    case OpType::kBroadcast: {
      if (c.in_elems > 0)
        check_nccl(ncclBroadcast(in, out, sz(c.in_elems), dt, c.peer, comm_, stream_),
                   "ncclBroadcast", comm_);
      if (me == c.peer)
        c.sent_bytes = (n - 1) * c.in_elems * es;
      else
        c.recv_bytes = c.in_elems * es;
      break;
    }
    case OpType::kAllToAll: {
      const auto soff = offsets_of(c.counts);
      const auto roff = offsets_of(c.recv_counts);
      d2d(out + roff[sz(me)] * es, in + soff[sz(me)] * es, c.recv_counts[sz(me)]);
      NcclGroupScope g(comm_);
      for (int r = 0; r < n; ++r) {
        if (r == me) continue;
        if (c.counts[sz(r)] > 0)
          check_nccl(ncclSend(in + soff[sz(r)] * es, sz(c.counts[sz(r)]), dt, r, comm_, stream_),
                     "ncclSend (all_to_all)", comm_);
        if (c.recv_counts[sz(r)] > 0)
          check_nccl(
              ncclRecv(out + roff[sz(r)] * es, sz(c.recv_counts[sz(r)]), dt, r, comm_, stream_),
              "ncclRecv (all_to_all)", comm_);
        c.sent_bytes += c.counts[sz(r)] * es;
        c.recv_bytes += c.recv_counts[sz(r)] * es;
      }
      g.end();
      break;
    }
    case OpType::kBarrier: {
      char* s = scratch(4);  // what it holds does not matter
      check_nccl(ncclAllReduce(s, s, 1, ncclFloat32, ncclSum, comm_, stream_),
                 "ncclAllReduce (barrier)", comm_);
      break;
    }
    default:
      MT_ASSERT(false);
  }
}

WorkPtr NcclBackend::start_p2p(std::shared_ptr<OpCall> call, P2pDone done) {
  if (call->device != mem::Device::kCuda) return host_->start_p2p(std::move(call), std::move(done));
  check_usable(true, fmt::format("{} #{}", op_name(call->op), call->seq));
  check_cuda(cudaSetDevice(dev_), "cudaSetDevice");
  auto w = std::make_shared<NcclP2pWork>(this, call, std::move(done));
  check_cuda(cudaEventCreateWithFlags(&w->ready, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventRecord(w->ready, static_cast<cudaStream_t>(call->cuda_stream)),
             "cudaEventRecord (the calling rank's stream)");
  std::lock_guard lock(p2p_mu_);
  pending_.push_back(w);
  return w;
}

void NcclBackend::flush_p2p_locked() {
  if (pending_.empty()) return;
  std::vector<std::shared_ptr<NcclP2pWork>> ops;
  ops.swap(pending_);
  try {
    check_usable(true, "send/recv");
    check_cuda(cudaSetDevice(dev_), "cudaSetDevice");
    auto batch = std::make_shared<P2pBatch>();
    check_cuda(cudaEventCreateWithFlags(&batch->done, cudaEventDisableTiming), "cudaEventCreate");
    for (auto& w : ops)
      check_cuda(cudaStreamWaitEvent(p2p_stream_, w->ready, 0), "cudaStreamWaitEvent (p2p)");
    {
      NcclGroupScope g(p2p_comm_);
      for (auto& w : ops) {
        const OpCall& c = *w->call;
        if (c.op == OpType::kSend && c.in_elems > 0)
          check_nccl(
              ncclSend(c.in, sz(c.in_elems), nccl_type(c.dtype), c.peer, p2p_comm_, p2p_stream_),
              "ncclSend", p2p_comm_);
        else if (c.op == OpType::kRecv && c.out_elems > 0)
          check_nccl(
              ncclRecv(c.out, sz(c.out_elems), nccl_type(c.dtype), c.peer, p2p_comm_, p2p_stream_),
              "ncclRecv", p2p_comm_);
      }
      g.end();
    }
    check_cuda(cudaEventRecord(batch->done, p2p_stream_), "cudaEventRecord (p2p)");
    for (auto& w : ops) w->batch = batch;
  } catch (...) {
    for (auto& w : ops) w->issue_error = std::current_exception();
  }
}

std::shared_ptr<P2pBatch> NcclBackend::issued_batch(NcclP2pWork& w) {
  std::lock_guard lock(p2p_mu_);
  if (!w.batch && !w.issue_error) flush_p2p_locked();
  if (w.issue_error) std::rethrow_exception(w.issue_error);
  return w.batch;
}

bool NcclP2pWork::test() {
  if (finished_) return rethrow();
  try {
    auto b = backend_->issued_batch(*this);
    if (!backend_->query_event(
            b->done, true,
            fmt::format("{} #{} on {}", op_name(call->op), call->seq, backend_->name())))
      return false;
  } catch (...) {
    finish(std::current_exception());
    return rethrow();
  }
  finish(nullptr);
  return true;
}

bool NcclP2pWork::poll() {
  if (finished_) return rethrow();
  return backend_->issued(*this) && test();
}

void NcclP2pWork::wait() {
  if (finished_) {
    rethrow();
    return;
  }
  try {
    auto b = backend_->issued_batch(*this);
    backend_->wait_event(
        b->done, true, fmt::format("{} #{} on {}", op_name(call->op), call->seq, backend_->name()));
  } catch (...) {
    finish(std::current_exception());
    rethrow();
  }
  finish(nullptr);
}

void NcclP2pWork::finish(std::exception_ptr e) {
  if (finished_) return;
  finished_ = true;
  error_ = e;
  if (!e) {
    const int64_t es = dtype_bytes(call->dtype);
    if (call->op == OpType::kSend)
      call->sent_bytes = call->in_elems * es;
    else
      call->recv_bytes = call->out_elems * es;
  }
  done_(*call, e);
}

std::unique_ptr<Backend> NcclBackend::split(OpCall& call, int color, int key,
                                            const std::string& name,
                                            std::vector<int>* world_ranks) {
  check_usable(false, fmt::format("split #{}", call.seq));
  // The host twin first (it also checks that every rank is in this split and fills the
  // world ranks), then NCCL's split of the communicator, in the same order on every rank.
  std::unique_ptr<Backend> host_sub = host_->split(call, color, key, name, world_ranks);
  check_cuda(cudaSetDevice(dev_), "cudaSetDevice");
  ncclComm_t sub = nullptr;
  check_nccl(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr),
             "ncclCommSplit", comm_);
  if (color < 0) {
    if (sub) (void)ncclCommDestroy(sub);
    return nullptr;
  }
  if (!sub)
    fail_run("nccl backend: ncclCommSplit of {} gave no communicator for color {}", name_, color);
  return std::make_unique<NcclBackend>(sub, nullptr, std::move(host_sub), name, dev_, job_,
                                       world_rank_);
}

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(Group& host_world) {
  if (!device::on_cuda())
    fail(
        "--backend nccl: rank {} computes on the CPU; each rank thread must call "
        "device::use_cuda(its GPU) before the NCCL communicator is made",
        host_world.world_rank());
  const int dev = device::current_index();
  ncclUniqueId id{};
  if (host_world.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr);
  // 128 bytes, carried bit for bit as 32 f32 words (the host backends copy bytes).
  host_world.broadcast(Buf(&id, sizeof(id) / 4, DType::kF32, mem::Device::kCpu), 0);
  // The host twin of the world: host-memory ops and split metadata (see nccl_backend.h).
  std::unique_ptr<Group> host = host_world.split(0, host_world.rank(), "world");
  check_cuda(cudaSetDevice(dev), "cudaSetDevice");
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, host_world.size(), id, host_world.rank());
  if (r != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    fail_run(
        "nccl backend: ncclCommInitRank (rank {} of {} on GPU {}) failed: {}{}{} (NCCL needs "
        "one GPU per rank: to share a GPU among rank threads use --backend local)",
        host_world.rank(), host_world.size(), dev, ncclGetErrorString(r), last && *last ? ": " : "",
        last ? last : "");
  }
  return std::make_unique<NcclBackend>(comm, std::move(host), nullptr, "world", dev,
                                       host_world.context()->job, host_world.world_rank());
}

}  // namespace mt::comm
