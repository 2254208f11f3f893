// comm::Group: the one door through which all communication goes (DESIGN.md, idea 4).
//
// A Group is one rank's handle on a set of ranks (the world, or a mesh dimension). Every
// call is checked, given a sequence number, recorded in the rank's flight recorder with its
// exact byte counts, and watched by the watchdog. The work itself is done by a Backend
// (c10d's Backend): `local` (threads of one process) or `mpi` (Open MPI).
//
// Rules (as for NCCL communicators and MPI collectives):
//  - every rank of a group calls the same collectives in the same order with matching
//    dtypes and counts; a mismatch is reported as an error (never corrupts memory);
//  - one thread at a time issues calls on a given Group; different Groups of one rank may
//    be used from different threads;
//  - async calls on a group run in call order on the group's progress thread; a blocking
//    call waits for the earlier async ones of its group; send/recv run independently.
//  - a buffer passed to an async call must stay alive and untouched until wait()/test().
//  - buffers may be on the GPU of the calling rank thread (device::use_cuda): the nccl
//    backend moves them directly, the host backends stage them through host memory
//    (comm/staging.h). Every rank passes buffers on the same kind of device to one op.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/recorder.h"
#include "comm/types.h"

namespace mt::comm {

class Job;
class HostStaging;

// What one rank owns across all its groups.
struct RankContext {
  int world_rank = 0;
  int world_size = 1;
  FlightRecorder recorder;
  Job* job = nullptr;
  RankContext(int rank, int size, size_t capacity, Job* j)
      : world_rank(rank), world_size(size), recorder(rank, capacity), job(j) {}
};

using P2pDone = std::function<void(const OpCall&, std::exception_ptr)>;

// The transport of one group, seen from one rank.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view kind() const = 0;  // "local", "mpi"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Runs one collective to completion on the calling thread; fills call.sent_bytes and
  // call.recv_bytes. Throws mt::Error on a mismatch between ranks or when the job aborts.
  virtual void run(OpCall& call) = 0;
  // Starts a send or recv. `done` is called exactly once, possibly on another thread, when
  // it completed (nullptr) or failed. The returned Work waits for that.
  virtual WorkPtr start_p2p(std::shared_ptr<OpCall> call, P2pDone done) = 0;
  // Collective: ranks passing the same color >= 0 form a new group, ordered by (key, rank).
  // Returns nullptr for color < 0. `name` names the new group (the same on its ranks).
  virtual std::unique_ptr<Backend> split(OpCall& call, int color, int key, const std::string& name,
                                         std::vector<int>* world_ranks) = 0;
};

class Group {
 public:
  Group(std::shared_ptr<RankContext> ctx, std::unique_ptr<Backend> backend, std::string name,
        std::vector<int> world_ranks);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // group rank -> world rank
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  int world_rank() const { return ctx_->world_rank; }
  std::string_view backend_kind() const { return backend_->kind(); }
  // The transport itself, for a backend built on another one (nccl keeps a host group for
  // host buffers and metadata). Calls made through it are not checked, numbered, recorded
  // or staged: the caller's own Group does that.
  Backend& backend() { return *backend_; }
  FlightRecorder& recorder() { return ctx_->recorder; }
  const std::shared_ptr<RankContext>& context() const { return ctx_; }

  // --- collectives (blocking). In place where one buffer is given.
  void all_reduce(Buf data, ReduceOp op = ReduceOp::kSum);
  void all_reduce(Buf in, Buf out, ReduceOp op = ReduceOp::kSum);
  // in: size()*out.elems; this rank gets piece rank() of the reduction. `out` may be this
  // rank's own piece of `in`.
  void reduce_scatter(Buf in, Buf out, ReduceOp op = ReduceOp::kSum);
  // Uneven pieces: counts[r] elements go to rank r; in.elems = sum(counts).
  void reduce_scatter(Buf in, Buf out, const std::vector<int64_t>& counts,
                      ReduceOp op = ReduceOp::kSum);
  // out: size()*in.elems, rank r's piece at r*in.elems. `in` may be this rank's piece of out.
  void all_gather(Buf in, Buf out);
  // Uneven pieces: rank r contributes counts[r] elements; out.elems = sum(counts).
  void all_gather(Buf in, Buf out, const std::vector<int64_t>& counts);
  void broadcast(Buf data, int root);
  // Equal pieces: in.elems = out.elems = size()*piece; piece j of in goes to rank j.
  void all_to_all(Buf in, Buf out);
  // Uneven: send_counts[j] elements (consecutive in `in`) go to rank j; recv_counts[j]
  // elements from rank j land consecutively in `out`. Must match the peers' counts.
  void all_to_all(Buf in, Buf out, const std::vector<int64_t>& send_counts,
                  const std::vector<int64_t>& recv_counts);
  // The all-to-all of Mixture-of-Experts dispatch and combine (GShard's, Megatron-Core's
  // token dispatcher; MPI_Alltoallv): the uneven all_to_all above under the name MoE code
  // looks for. Any count may be zero, a rank may send or receive nothing at all; recorded
  // as all_to_all with its exact bytes. f32, bf16 or i32.
  void all_to_all_v(Buf in, Buf out, const std::vector<int64_t>& send_counts,
                    const std::vector<int64_t>& recv_counts) {
    all_to_all(in, out, send_counts, recv_counts);
  }
  // The receive counts of all_to_all_v from everyone's send counts: an equal all_to_all of
  // the counts (as i32 pairs, exact up to 2^63), itself recorded (8 bytes per peer).
  std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send_counts);
  // exchange_counts, then all_to_all_v into `out`, resized to the received total; returns
  // the receive counts.
  template <typename T>
  std::vector<int64_t> all_to_all_v(const T* in, std::vector<T>& out,
                                    const std::vector<int64_t>& send_counts) {
    std::vector<int64_t> recv = exchange_counts(send_counts);
    int64_t n_in = 0, n_out = 0;
    for (int64_t c : send_counts) n_in += c;
    for (int64_t c : recv) n_out += c;
    out.resize(static_cast<size_t>(n_out));
    all_to_all(Buf(const_cast<T*>(in), n_in), Buf(out.data(), n_out), send_counts, recv);
    return recv;
  }
  void barrier();

  // --- point to point (group ranks; tags match in order like MPI). send blocks until the
  // matching recv has taken the data; use send_async or send_recv to exchange both ways.
  void send(Buf data, int peer, int tag = 0);
  void recv(Buf data, int peer, int tag = 0);
  void send_recv(Buf send_data, int dst, Buf recv_data, int src, int tag = 0);

  // --- asynchronous forms
  WorkPtr all_reduce_async(Buf data, ReduceOp op = ReduceOp::kSum);
  WorkPtr all_reduce_async(Buf in, Buf out, ReduceOp op = ReduceOp::kSum);
  WorkPtr reduce_scatter_async(Buf in, Buf out, ReduceOp op = ReduceOp::kSum);
  WorkPtr reduce_scatter_async(Buf in, Buf out, const std::vector<int64_t>& counts,
                               ReduceOp op = ReduceOp::kSum);
  WorkPtr all_gather_async(Buf in, Buf out);
  WorkPtr all_gather_async(Buf in, Buf out, const std::vector<int64_t>& counts);
  WorkPtr broadcast_async(Buf data, int root);
  WorkPtr all_to_all_async(Buf in, Buf out);
  WorkPtr all_to_all_async(Buf in, Buf out, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& recv_counts);
  WorkPtr barrier_async();
  WorkPtr send_async(Buf data, int peer, int tag = 0);
  WorkPtr recv_async(Buf data, int peer, int tag = 0);

  // Collective over this group (like MPI_Comm_split): ranks with the same color >= 0 form
  // a group named `name`, ordered by (key, rank); color < 0 gives nullptr.
  std::unique_ptr<Group> split(int color, int key, const std::string& name);

 private:
  struct Pending;
  struct Worker;
  std::shared_ptr<OpCall> make_call(OpType op, Buf in, Buf out);
  void refuse_integer_reduction(const char* what, Buf in) const;
  WorkPtr submit(std::shared_ptr<OpCall> call, bool async);
  WorkPtr submit_p2p(std::shared_ptr<OpCall> call);
  // The flight recorder's record of c: queued, or (an op run inline) queued and started.
  int64_t record(const OpCall& c, bool started);
  void execute(Pending& p);
  void run_call(OpCall& c);
  void run_over_link(OpCall& c);  // run_call, lasting at least a simulated link's time
  void check_peer(int peer, const char* what) const;

  std::shared_ptr<RankContext> ctx_;
  std::unique_ptr<Backend> backend_;
  std::string name_;
  std::vector<int> world_ranks_;
  int rank_ = 0;
  int size_ = 1;
  int64_t next_seq_ = 1;
  bool equal_pieces_ = false;
  bool blocking_ = false;                           // set while a blocking form runs its async twin
  std::map<std::pair<int, int>, int64_t> p2p_seq_;  // (peer, 0 send / 1 recv) -> next seq
  std::mutex p2p_mu_;
  // The tracker current when the group was made; it outlives the group (launch makes the
  // world before fn and destroys it after; fn's groups die before fn's tracker). What the
  // group keeps (staging) and what its progress thread allocates count against it, never
  // against a tracker scoped inside fn that is gone when the group frees them.
  mem::Tracker* tracker_ = nullptr;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<HostStaging> staging_;  // device buffers on a host backend (comm/staging.h)
  std::shared_ptr<OpCall> spare_call_;    // the last collective's call, reused (make_call)
};

}  // namespace mt::comm
