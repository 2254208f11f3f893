// `meshtrain bench comm`: collective bandwidth in the format of nccl-tests (size, time,
// algorithm bandwidth, bus bandwidth) for our local and mpi backends and for Open MPI called
// directly (raw-mpi), side by side. busbw = algbw x the ring factor of the op (nccl-tests,
// doc/PERFORMANCE.md): 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and
// all_to_all, 1 for send/recv. Sizes are nccl-tests' S: the all_reduce buffer, all_gather's
// output, reduce_scatter's input, all_to_all's buffer, the message of send/recv.
// all_to_all_v (MoE dispatch) sends uneven pieces of that buffer (cli/bench_a2av.h):
// --counts skew (rank s gives rank d the share ((s + d) mod n) / (n(n-1)/2), one zero per
// rank) or --counts moe (rows of --width floats, the hotter experts on the higher ranks, the
// receive side imbalanced); raw-mpi runs the same counts through MPI_Alltoallv, and
// mpi-and-raw runs both in one job, alternating their batches (a fair ratio on shared cores).
// Before it is timed at each size, every rank checks what it received against what its sources
// sent, and a wrong element ends the run.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench_a2av.h"
#include "cli/commands.h"
#include "comm/launch.h"
#include "comm/mpi.h"
#include "core/clock.h"
#include "core/error.h"

namespace mt::cli {

namespace {

struct BenchCommOptions {
  std::string backend = "local";
  int ranks = 4;
  bool json = false;
  int64_t min_bytes = 4096;
  int64_t max_bytes = 64 << 20;
  std::vector<std::string> ops = {"all_reduce", "all_gather",   "reduce_scatter",
                                  "all_to_all", "all_to_all_v", "send_recv"};
  std::string counts = "skew";  // all_to_all_v's pattern (cli/bench_a2av.h)
  int64_t width = 256;          // --counts moe: floats per row
};

// What one rank does per op, whichever library carries it. Buffers are f32.
class Ops {
 public:
  explicit Ops(A2avPattern p, int64_t width) : pattern(p), width(width) {}
  virtual ~Ops() = default;
  virtual int rank() = 0;
  virtual int size() = 0;
  virtual void run(const std::string& op, float* in, float* out, int64_t elems) = 0;
  virtual void barrier() = 0;
  virtual double max(double v) = 0;
  const A2avPattern pattern;
  const int64_t width;
};

class GroupOps : public Ops {
 public:
  GroupOps(comm::Group& g, A2avPattern p, int64_t width) : Ops(p, width), g_(g) {}
  int rank() override { return g_.rank(); }
  int size() override { return g_.size(); }
  void run(const std::string& op, float* in, float* out, int64_t e) override {
    const int n = g_.size();
    if (op == "all_reduce") g_.all_reduce(comm::Buf(in, e), comm::Buf(out, e));
    if (op == "all_gather") g_.all_gather(comm::Buf(in, e / n), comm::Buf(out, e));
    if (op == "reduce_scatter") g_.reduce_scatter(comm::Buf(in, e), comm::Buf(out, e / n));
    if (op == "all_to_all") g_.all_to_all(comm::Buf(in, e), comm::Buf(out, e));
    if (op == "all_to_all_v") {
      const A2avCounts c = a2av_counts(pattern, g_.rank(), n, e, width);
      g_.all_to_all_v(comm::Buf(in, c.send_total), comm::Buf(out, c.recv_total), c.send, c.recv);
    }
    if (op == "send_recv")
      g_.send_recv(comm::Buf(in, e), (g_.rank() + 1) % n, comm::Buf(out, e),
                   (g_.rank() + n - 1) % n);
  }
  void barrier() override { g_.barrier(); }
  double max(double v) override {
    float f = static_cast<float>(v);
    g_.all_reduce(comm::Buf(&f, 1), comm::ReduceOp::kMax);
    return f;
  }

 private:
  comm::Group& g_;
};

class RawMpiOps : public Ops {
 public:
  RawMpiOps(A2avPattern p, int64_t width) : Ops(p, width) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() override { return rank_; }
  int size() override { return size_; }
  void run(const std::string& op, float* in, float* out, int64_t e64) override {
    const int n = size_;
    const int e = static_cast<int>(e64);
    if (op == "all_reduce") MPI_Allreduce(in, out, e, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (op == "all_gather")
      MPI_Allgather(in, e / n, MPI_FLOAT, out, e / n, MPI_FLOAT, MPI_COMM_WORLD);
    if (op == "reduce_scatter")
      MPI_Reduce_scatter_block(in, out, e / n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (op == "all_to_all")
      MPI_Alltoall(in, e / n, MPI_FLOAT, out, e / n, MPI_FLOAT, MPI_COMM_WORLD);
    if (op == "all_to_all_v") {
      const A2avCounts c = a2av_counts(pattern, rank_, n, e64, width);
      const auto un = static_cast<size_t>(n);
      std::vector<int> sc(un), sd(un), rc(un), rd(un);
      int so = 0, ro = 0;
      for (size_t r = 0; r < size_t(n); ++r) {
        sc[r] = static_cast<int>(c.send[r]);
        rc[r] = static_cast<int>(c.recv[r]);
        sd[r] = so;
        rd[r] = ro;
        so += sc[r];
        ro += rc[r];
      }
      MPI_Alltoallv(in, sc.data(), sd.data(), MPI_FLOAT, out, rc.data(), rd.data(), MPI_FLOAT,
                    MPI_COMM_WORLD);
    }
    if (op == "send_recv")
      MPI_Sendrecv(in, e, MPI_FLOAT, (rank_ + 1) % n, 0, out, e, MPI_FLOAT, (rank_ + n - 1) % n, 0,
                   MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  double max(double v) override {
    double m = 0;
    MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
  }

 private:
  int rank_ = 0, size_ = 1;
};

double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "send_recv") return 1.0;
  return static_cast<double>(n - 1) / n;
}

// One all_to_all_v into a poisoned `out`, then every rank checks what it received; a wrong
// element anywhere ends the run on every rank (after the check's max over the ranks).
void check_a2av(Ops& ops, float* in, std::vector<float>& out, int64_t elems,
                const std::string& backend) {
  const int n = ops.size(), me = ops.rank();
  std::fill(out.begin(), out.end(), -1.0f);  // no input value is negative
  ops.run("all_to_all_v", in, out.data(), elems);
  const A2avCheck c = check_a2av_output(ops.pattern, me, n, elems, ops.width, out.data());
  const double worst = ops.max(static_cast<double>(c.wrong));
  if (worst > 0)
    fail_run(
        "bench comm: all_to_all_v on {} with {} ranks, {} elements per rank, delivered wrong "
        "data: rank {} has {} wrong elements (the first at {}: {} where its source sent {}); "
        "the most on one rank: {:.0f}",
        backend, n, elems, me, c.wrong, c.first, c.got, c.want, worst);
}

// One library under test and the name its rows carry.
struct Side {
  Ops* ops;
  std::string backend;
};

// Runs the sweep on one rank; rank 0 collects the rows. With two sides (mpi-and-raw) their
// batches alternate at every size, so that both meet the same machine: a ratio of two
// separate runs on shared cores drifts by more than the few percent it is meant to show.
nlohmann::json sweep(const std::vector<Side>& sides, const BenchCommOptions& o) {
  Ops& first = *sides.front().ops;
  const int n = first.size();
  const int64_t max_elems = o.max_bytes / 4;
  std::vector<float> in(static_cast<size_t>(max_elems)), out(static_cast<size_t>(max_elems));
  fill_a2av_input(in.data(), first.rank(), max_elems);  // what all_to_all_v's check reads
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& op : o.ops) {
    if (first.rank() == 0 && !o.json) {
      std::string names = sides[0].backend;
      for (size_t k = 1; k < sides.size(); ++k) names += " and " + sides[k].backend;
      std::printf("# %s  backend %s  ranks %d\n#%13s %12s %11s %12s %12s\n", op.c_str(),
                  names.c_str(), n, "size(B)", "count(elems)", "time(us)", "algbw(GB/s)",
                  "busbw(GB/s)");
    }
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
      const bool a2av = op == "all_to_all_v";
      // Divisible by the group size; all_to_all_v's moe counts: whole rows.
      const int64_t granule = a2av && first.pattern == A2avPattern::kMoe ? first.width : n;
      const int64_t elems = bytes / 4 / granule * granule;
      if (elems == 0) continue;
      const int64_t S = elems * 4;
      if (a2av) {  // the moe pattern's hottest rank receives more than it sends
        const A2avCounts c = a2av_counts(first.pattern, first.rank(), n, elems, first.width);
        if (static_cast<int64_t>(out.size()) < c.recv_total) out.resize(size_t(c.recv_total));
      }
      // Five batches per side; the time of a batch is its slowest rank's mean; the median
      // batch is reported (the cores are shared with other jobs, so single batches are noisy).
      int iters = static_cast<int>(std::clamp<int64_t>((int64_t{128} << 20) / S, 2, 50));
      for (const Side& side : sides) {
        for (int w = 0; w < 2; ++w) side.ops->run(op, in.data(), out.data(), elems);
        if (a2av) check_a2av(*side.ops, in.data(), out, elems, side.backend);
      }
      std::vector<std::vector<double>> batches(sides.size());
      for (int b = 0; b < 5; ++b)
        for (size_t j = 0; j < sides.size(); ++j) {
          const size_t k =
              (j + static_cast<size_t>(b)) % sides.size();  // each side goes first in turn
          Ops& ops = *sides[k].ops;
          ops.barrier();
          double t0 = now_s();
          for (int i = 0; i < iters; ++i) ops.run(op, in.data(), out.data(), elems);
          batches[k].push_back(ops.max((now_s() - t0) / iters));
        }
      for (size_t k = 0; k < sides.size(); ++k) {
        std::sort(batches[k].begin(), batches[k].end());
        const double t = batches[k][2];
        const double algbw = static_cast<double>(S) / t / 1e9;
        const double busbw = algbw * bus_factor(op, n);
        if (first.rank() != 0) continue;
        rows.push_back({{"op", op},
                        {"backend", sides[k].backend},
                        {"ranks", n},
                        {"bytes", S},
                        {"time_s", t},
                        {"algbw_gbps", algbw},
                        {"busbw_gbps", busbw}});
        if (sides.size() > 1) rows.back()["interleaved_with"] = sides[1 - k].backend;
        if (a2av) {
          rows.back()["counts"] = o.counts;
          rows.back()["checked"] = true;
          if (first.pattern == A2avPattern::kMoe) rows.back()["width"] = first.width;
        }
        if (!o.json)
          std::printf(" %13lld %12lld %11.1f %12.3f %12.3f%s\n", static_cast<long long>(S),
                      static_cast<long long>(elems), t * 1e6, algbw, busbw,
                      sides.size() > 1 ? ("  " + sides[k].backend).c_str() : "");
      }
    }
    if (first.rank() == 0 && !o.json) std::fflush(stdout);
  }
  return rows;
}

void run_bench_comm(const BenchCommOptions& o) {
  if (o.min_bytes < 4 || o.max_bytes < o.min_bytes)
    fail("--min-bytes {} / --max-bytes {}: need 4 <= min <= max", o.min_bytes, o.max_bytes);
  nlohmann::json rows;
  if (o.backend != "local" && o.ranks > 1 && !comm::started_by_mpirun())
    fail("--backend {} --ranks {}: run it under mpirun -np {}", o.backend, o.ranks, o.ranks);
  if (o.backend == "raw-mpi") {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    RawMpiOps ops(parse_a2av_pattern(o.counts), o.width);
    if (o.ranks > 0 && ops.size() != o.ranks && comm::started_by_mpirun()) {
      MPI_Finalize();
      fail("--ranks {} but mpirun started {} processes; run mpirun -np {}", o.ranks, ops.size(),
           o.ranks);
    }
    rows = sweep({{&ops, "raw-mpi"}}, o);
    MPI_Finalize();
    if (ops.rank() != 0) return;
  } else {
    comm::LaunchOptions lo;
    const bool paired = o.backend == "mpi-and-raw";
    const std::string backend = paired ? "mpi" : o.backend;
    lo.backend = comm::parse_backend(backend);
    lo.world_size = backend == "mpi" ? 0 : o.ranks;
    lo.threads_per_rank = 1;  // the ranks' reductions run on their own thread
    if (backend == "mpi" && o.ranks > 0 && comm::mpi_env_world_size() != o.ranks)
      fail("--backend mpi --ranks {}: run it under mpirun -np {} (mpirun started {})", o.ranks,
           o.ranks, comm::mpi_env_world_size());
    std::mutex mu;
    comm::launch(lo, [&](comm::Group& world) {
      GroupOps ops(world, parse_a2av_pattern(o.counts), o.width);
      // mpi-and-raw: Open MPI called directly on MPI_COMM_WORLD in the same processes, its
      // batches alternating with the mpi backend's (its own communicator).
      std::unique_ptr<RawMpiOps> raw;
      if (paired) raw = std::make_unique<RawMpiOps>(parse_a2av_pattern(o.counts), o.width);
      auto r =
          paired ? sweep({{&ops, "mpi"}, {raw.get(), "raw-mpi"}}, o) : sweep({{&ops, backend}}, o);
      if (world.rank() == 0) {
        std::lock_guard lock(mu);
        rows = r;
      }
    });
    if (backend == "mpi" && comm::mpi_env_world_size() > 0) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (rank != 0) return;
    }
  }
  if (o.json) std::printf("%s\n", rows.dump(2).c_str());
}

}  // namespace

void register_bench_comm(CLI::App& bench) {
  auto o = std::make_shared<BenchCommOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "comm", "collective bandwidth (nccl-tests format): local, mpi, or Open MPI directly");
  cmd->add_option("--backend", o->backend,
                  "local, mpi (under mpirun), raw-mpi (under mpirun), or mpi-and-raw (under "
                  "mpirun: both in one run, their batches alternating)")
      ->check(CLI::IsMember({"local", "mpi", "raw-mpi", "mpi-and-raw"}));
  cmd->add_option("--ranks", o->ranks, "ranks (local: threads; mpi: must match mpirun -np)");
  cmd->add_flag("--json", o->json, "print a JSON list of rows instead of the table");
  cmd->add_option("--min-bytes", o->min_bytes, "smallest size (default 4 KiB)");
  cmd->add_option("--max-bytes", o->max_bytes, "largest size (default 64 MiB), x4 steps");
  cmd->add_option("--ops", o->ops, "ops to run")
      ->check(CLI::IsMember({"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                             "all_to_all_v", "send_recv"}));
  cmd->add_option("--counts", o->counts,
                  "all_to_all_v's counts: skew (one zero per rank) or moe (rows of --width "
                  "floats, the higher ranks' experts hotter: MoE dispatch; cli/bench_a2av.h)")
      ->check(CLI::IsMember({"skew", "moe"}));
  cmd->add_option("--width", o->width, "--counts moe: floats per row (d_model; default 256)")
      ->check(CLI::PositiveNumber);
  cmd->callback([o] { run_bench_comm(*o); });
}

}  // namespace mt::cli
