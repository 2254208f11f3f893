// The pipeline executor on NCCL's point-to-point semantics, emulated on the host (no GPU):
// the real Executor drives P rank threads over a backend that behaves like comm/nccl for
// send/recv. Operations stay pending until one not yet issued is tested or waited on, then
// all pending ones are issued as one group (NcclBackend::issued_batch, flush_p2p_locked);
// poll() issues nothing; a rank's groups run one after another (its p2p stream); a message
// moves once its send and its receive are both in running groups (a send waits for its
// receive: messages larger than NCCL's buffers, so small messages that NCCL would send
// eagerly are treated pessimistically), matched per (sender, receiver) in issue order, not
// by tag; a group's operations complete together when all its messages moved. Under this the
// per-action lists of the interleaved schedule hang; Megatron-LM's batched exchanges
// (Lowering::kBatched) run, as the executor posts each exchange's receives together and the
// stage polls its sends (one exchange, one group). docs/pipeline.md, "Blocking exchanges".
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/group.h"
#include "core/error.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule.h"

namespace mt::parallel::pp {
namespace {

struct Op {
  std::shared_ptr<comm::OpCall> call;
  comm::P2pDone on_done;
  int rank = 0;
  bool issued = false;  // in a group
  bool moved = false;   // its message moved
  bool done = false;    // its group ended (NCCL completes a group's operations together)
};
using OpPtr = std::shared_ptr<Op>;

// What all ranks share: each rank's pending operations and issued groups, and per
// (sender, receiver) the sends and receives in issue order.
struct Wire {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<OpPtr>> pending;
  std::vector<std::deque<std::vector<OpPtr>>> groups;  // the head group is running
  std::map<std::pair<int, int>, std::deque<OpPtr>> sends, recvs;
  // A hang: every rank that has not finished waits for an operation that has not completed.
  std::vector<OpPtr> awaited;  // per rank, the operation it waits for
  int finished = 0;
  bool hung = false;

  explicit Wire(int p) : pending(size_t(p)), groups(size_t(p)), awaited(size_t(p)) {}

  bool all_stuck() const {
    int stuck = 0;
    for (const OpPtr& o : awaited) stuck += o && !o->done;
    return stuck + finished == int(awaited.size());
  }

  bool running(const OpPtr& op) const {
    const auto& q = groups[size_t(op->rank)];
    if (q.empty()) return false;
    for (const OpPtr& o : q.front())
      if (o == op) return true;
    return false;
  }

  // Moves every message whose send and receive both run; retires finished head groups.
  void progress() {
    for (bool again = true; again;) {
      again = false;
      for (auto& [pair, s] : sends) {
        auto& r = recvs[pair];
        while (!s.empty() && !r.empty() && running(s.front()) && running(r.front())) {
          const comm::OpCall& in = *s.front()->call;
          comm::OpCall& out = *r.front()->call;
          std::memcpy(out.out, in.in, size_t(in.in_elems) * dtype_bytes(in.dtype));
          s.front()->moved = r.front()->moved = true;
          s.pop_front();
          r.pop_front();
          again = true;
        }
      }
      for (auto& q : groups)
        while (!q.empty() && std::all_of(q.front().begin(), q.front().end(),
                                         [](const OpPtr& o) { return o->moved; })) {
          for (const OpPtr& o : q.front()) {
            o->done = true;
            o->on_done(*o->call, nullptr);
          }
          q.pop_front();
          again = true;
        }
    }
    cv.notify_all();
  }

  // NcclBackend::issued_batch: the first test or wait issues everything pending.
  void flush(int rank) {
    auto& p = pending[size_t(rank)];
    if (p.empty()) return;
    for (const OpPtr& o : p) {
      o->issued = true;
      const comm::OpCall& c = *o->call;
      const bool send = c.op == comm::OpType::kSend;
      (send ? sends : recvs)[send ? std::pair{rank, c.peer} : std::pair{c.peer, rank}].push_back(o);
    }
    groups[size_t(rank)].push_back(std::move(p));
    p.clear();
    progress();
  }
};

class RendezvousWork : public comm::Work {
 public:
  RendezvousWork(Wire& w, OpPtr op) : w_(w), op_(std::move(op)) {}
  // NcclBackend::issued_batch: an operation not yet issued issues everything pending.
  bool test() override {
    std::lock_guard lock(w_.mu);
    if (!op_->issued) w_.flush(op_->rank);
    return op_->done;
  }
  bool poll() override {
    std::lock_guard lock(w_.mu);
    return op_->done;
  }
  void wait() override {
    std::unique_lock lock(w_.mu);
    if (!op_->issued) w_.flush(op_->rank);
    w_.awaited[size_t(op_->rank)] = op_;
    while (!op_->done && !w_.hung) {
      // Only a rank that runs can issue more: when all wait, nothing will ever move.
      if (w_.all_stuck()) {
        w_.hung = true;
        w_.cv.notify_all();
        break;
      }
      // (The deadline only guards the test itself against a bug in this emulation.)
      if (w_.cv.wait_for(lock, std::chrono::seconds(60)) == std::cv_status::timeout) break;
    }
    w_.awaited[size_t(op_->rank)] = nullptr;
    if (!op_->done)
      fail_run("rendezvous p2p hang: rank {} waits on {} with peer {}", op_->rank,
               comm::op_name(op_->call->op), op_->call->peer);
  }

 private:
  Wire& w_;
  OpPtr op_;
};

class RendezvousBackend : public comm::Backend {
 public:
  RendezvousBackend(Wire& w, int rank, int size) : w_(w), rank_(rank), size_(size) {}
  std::string_view kind() const override { return "rendezvous"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void run(comm::OpCall&) override { fail_run("collectives are not emulated"); }
  comm::WorkPtr start_p2p(std::shared_ptr<comm::OpCall> call, comm::P2pDone done) override {
    auto op = std::make_shared<Op>(Op{std::move(call), std::move(done), rank_});
    std::lock_guard lock(w_.mu);
    w_.pending[size_t(rank_)].push_back(op);
    return std::make_shared<RendezvousWork>(w_, op);
  }
  std::unique_ptr<comm::Backend> split(comm::OpCall&, int, int, const std::string&,
                                       std::vector<int>*) override {
    fail_run("split is not emulated");
  }

 private:
  Wire& w_;
  int rank_, size_;
};

// A stage that computes nothing: one small buffer per message (contents checked: a
// received message carries the tag its sender wrote). Like train/pipeline_stage.cpp's pool,
// it looks at its sends when it hands out a receive buffer (a buffer is free once its send is
// done): with `poll` false it uses test(), which on nccl issues what is pending.
class TagStage : public Stage {
 public:
  TagStage(const Schedule& s, bool poll) : s_(s), poll_(poll) {}
  void compute(const Action&) override {}
  comm::Buf recv_buffer(const Action& a) override {
    std::erase_if(sends_, [&](const comm::WorkPtr& w) { return poll_ ? w->poll() : w->test(); });
    return buf(a);
  }
  comm::Buf send_buffer(const Action& a) override {
    comm::Buf b = buf(a);
    static_cast<float*>(b.ptr)[0] = float(message_tag(s_, a));
    return b;
  }
  void sent(const Action&, const comm::WorkPtr& w) override { sends_.push_back(w); }
  bool all_received_right() const {
    for (const auto& [key, v] : bufs_)
      if (key.first == 1 && v[0] != float(key.second)) return false;
    return true;
  }

 private:
  comm::Buf buf(const Action& a) {
    const bool recv = a.is_recv();
    auto& v = bufs_[{recv ? 1 : 0, message_tag(s_, a)}];
    v.assign(4, -1.0f);
    return comm::Buf(v.data(), 4);
  }
  const Schedule& s_;
  bool poll_;
  std::vector<comm::WorkPtr> sends_;
  std::map<std::pair<int, int>, std::vector<float>> bufs_;
};

// Runs one step of `s` with the real executor on every rank; "" when every rank finished and
// received the right messages, else the first error. The stages outlive the rank threads: a
// rank that fails leaves its operations on the wire.
std::string run_on_rendezvous(const Schedule& s, bool poll = true) {
  Wire wire(s.pp);
  std::vector<std::string> errors(size_t(s.pp));
  std::vector<std::unique_ptr<TagStage>> stages;
  for (int r = 0; r < s.pp; ++r) stages.push_back(std::make_unique<TagStage>(s, poll));
  std::vector<std::thread> threads;
  for (int r = 0; r < s.pp; ++r)
    threads.emplace_back([&, r] {
      try {
        auto ctx = std::make_shared<comm::RankContext>(r, s.pp, 64, nullptr);
        std::vector<int> world(size_t(s.pp));
        for (int k = 0; k < s.pp; ++k) world[size_t(k)] = k;
        comm::Group g(ctx, std::make_unique<RendezvousBackend>(wire, r, s.pp), "pp", world);
        Executor(s, r, g).run(*stages[size_t(r)]);
        if (!stages[size_t(r)]->all_received_right())
          errors[size_t(r)] = "a message landed in the wrong buffer";
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
      std::lock_guard lock(wire.mu);
      ++wire.finished;
      wire.cv.notify_all();
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (!e.empty()) return e;
  return "";
}

TEST(PipelineOnRendezvousP2p, BatchedExchangesRunPerActionInterleavingHangs) {
  // The smallest hang (pp 2, v 2, 4 microbatches) and a few more shapes.
  using K = ScheduleKind;
  EXPECT_NE(run_on_rendezvous(build_schedule(K::kInterleaved1F1B, 2, 4, 2)).find("hang"),
            std::string::npos);
  for (const auto& [p, m, v] :
       {std::tuple{2, 4, 2}, std::tuple{4, 8, 2}, std::tuple{4, 4, 3}, std::tuple{3, 6, 2}}) {
    SCOPED_TRACE(testing::Message() << "interleaved pp " << p << " m " << m << " v " << v);
    EXPECT_EQ(run_on_rendezvous(build_schedule(K::kInterleaved1F1B, p, m, v, Lowering::kBatched)),
              "");
  }
  // A stage that tests its sends for a free buffer issues the exchange's sends without its
  // receives (two groups): that hangs too (hence comm::Work::poll).
  EXPECT_NE(
      run_on_rendezvous(build_schedule(K::kInterleaved1F1B, 2, 4, 2, Lowering::kBatched), false)
          .find("hang"),
      std::string::npos);
  // GPipe, 1F1B and ZB-H1 run either way (GPipe's and 1F1B's two lowerings are the same
  // lists; ZB-H1's batched exchanges meet where its asynchronous timeline has them).
  for (K kind : {K::kGPipe, K::k1F1B, K::kZbH1})
    EXPECT_EQ(run_on_rendezvous(build_schedule(kind, 4, 8)), "") << schedule_kind_name(kind);
  for (const auto& [p, m] : {std::pair{2, 2}, std::pair{2, 5}, std::pair{4, 8}, std::pair{4, 13},
                             std::pair{8, 8}, std::pair{8, 20}}) {
    SCOPED_TRACE(testing::Message() << "zb1 pp " << p << " m " << m);
    EXPECT_EQ(run_on_rendezvous(build_schedule(K::kZbH1, p, m, 1, Lowering::kBatched)), "");
  }
}

}  // namespace
}  // namespace mt::parallel::pp
