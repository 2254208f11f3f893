// Several hosts on this machine (scripts/hosts.sh: network namespaces on a private bridge,
// Open MPI over TCP between them, docs/multihost.md). Each test makes its own hosts under a
// prefix of its own and removes them; where network namespaces cannot be made (not root, an
// unprivileged container) every test is skipped with the reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace mt::test {
namespace {

const std::string kHosts = std::string(MT_SOURCE_DIR) + "/scripts/hosts.sh";

class NamespaceHosts : public ::testing::Test {
 protected:
  // `n` hosts of `slots` ranks each; false (the test skipped) where netns is not permitted.
  void make_hosts(int n, int slots) {
    prefix_ = "mt" + std::to_string(::getpid() % 1000000);
    const RunResult up = run_command(kHosts + " up " + std::to_string(n) + " --slots " +
                                     std::to_string(slots) + " --prefix " + prefix_);
    if (up.exit_code != 0 &&
        (up.output.find("cannot create a network namespace") != std::string::npos ||
         up.output.find("(iproute2) is missing") != std::string::npos))
      GTEST_SKIP() << "no namespace hosts here: " << up.output;
    ASSERT_EQ(up.exit_code, 0) << up.output;
    made_ = true;
    const RunResult args = run_command(kHosts + " mpirun-args --prefix " + prefix_);
    ASSERT_EQ(args.exit_code, 0) << args.output;
    mpirun_args_ = args.output.substr(0, args.output.find('\n'));
  }
  void TearDown() override {
    if (made_) {
      const RunResult down = run_command(kHosts + " down --prefix " + prefix_);
      EXPECT_EQ(down.exit_code, 0) << down.output;
    }
  }
  // mpirun over the hosts: `np` processes, the environment root needs, extra mpirun options.
  RunResult mpirun(int np, const std::string& meshtrain_args, const std::string& extra = "") {
    return run_command(
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
        "ASAN_OPTIONS=\"$ASAN_OPTIONS:detect_leaks=0\" timeout 240 mpirun --oversubscribe " +
        mpirun_args_ + " " + extra + " -np " + std::to_string(np) + " " + MT_BINARY + " " +
        meshtrain_args);
  }
  std::string data() {
    dir_ = scratch_dir("multihost");
    return demo_tokens(dir_);
  }
  std::string prefix_, mpirun_args_;
  std::filesystem::path dir_;
  bool made_ = false;
};

// The acceptance run of issue 27: dp 2 x tp 2 x pp 2 on 4 hosts of 2 ranks, through mpirun
// over TCP (the btl is tcp between hosts; vader only inside one), against the oracle; the
// tolerances are verify's defaults (docs/verify.md: 8-20x the worst measured).
TEST_F(NamespaceHosts, VerifyDp2Tp2Pp2OnFourHostsOverTcp) {
  make_hosts(4, 2);
  if (IsSkipped()) return;
  const RunResult r = mpirun(8,
                             "verify --model tiny --n-layer 2 --seq 32 --batch 8 --threads 1 "
                             "--steps 3 --dp 2 --tp 2 --pp 2 --microbatches 2 --data " +
                                 data());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pp 2 (1f1b, 2 microbatches) x dp 2 (ZeRO-0) x tp 2"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("PASS"), std::string::npos) << r.output;
}

// Placement: mpirun deals the ranks round-robin over 2 hosts of 4 (--map-by node: world ranks
// 0, 2, 4, 6 on the first), yet tp 4 lands inside a host: its groups move no byte between
// hosts, which the flight recorders' sum says; --mesh-order with tp slowest puts it across.
TEST_F(NamespaceHosts, TpStaysInsideAHostWhateverTheMapping) {
  make_hosts(2, 4);
  if (IsSkipped()) return;
  const std::string run =
      "train --model tiny --n-layer 2 --seq 32 --batch 8 --threads 1 "
      "--steps 2 --tp 4 --data " +
      data();
  const RunResult in = mpirun(8, run, "--map-by node");
  ASSERT_EQ(in.exit_code, 0) << in.output;
  EXPECT_NE(in.output.find("on 2 hosts (up to 4 ranks each); tp inside hosts; dp across hosts"),
            std::string::npos)
      << in.output;
  EXPECT_NE(in.output.find("cross hosts (all ranks): tp 0.0 B dp "), std::string::npos)
      << in.output;
  EXPECT_EQ(in.output.find(" dp 0.0 B"), std::string::npos) << in.output;

  const RunResult across = mpirun(8, run + " --mesh-order tp,pp,cp,dp", "--map-by node");
  ASSERT_EQ(across.exit_code, 0) << across.output;
  EXPECT_NE(across.output.find("dp inside hosts; tp across hosts"), std::string::npos)
      << across.output;
  EXPECT_NE(across.output.find(" dp 0.0 B"), std::string::npos) << across.output;
  EXPECT_EQ(across.output.find(" tp 0.0 B"), std::string::npos) << across.output;
}

// A file's text ("" if it is not there yet).
std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// `calibrate` under mpirun over 2 hosts of 2 ranks, the link between them shaped to 100 Mbit/s
// each way: the cluster file's nodes are the hosts (2 ranks each, 2 of them), its inter-node
// link is the shaped TCP one (α-β and the all-reduce by size) and its intra-node link shared
// memory; `plan` then costs tp across the hosts above tp inside them.
TEST_F(NamespaceHosts, CalibrateMeasuresTheLinksInsideAndBetweenHosts) {
  make_hosts(2, 2);
  if (IsSkipped()) return;
  ASSERT_EQ(run_command(kHosts + " shape --rate 100mbit --prefix " + prefix_).exit_code, 0);
  const std::filesystem::path dir = scratch_dir("multihost-calibrate");
  const std::string cluster = (dir / "hosts.json").string();
  const RunResult r = mpirun(4, "calibrate --backend mpi --quick --out " + cluster);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 hosts of 2 ranks: all_reduce inside a host"), std::string::npos)
      << r.output;
  const nlohmann::json c = nlohmann::json::parse(slurp(cluster));
  EXPECT_EQ(c["gpus_per_node"].get<int>(), 2);
  EXPECT_EQ(c["max_nodes"].get<int>(), 2);
  EXPECT_EQ(c["backend"].get<std::string>(), "mpi");
  EXPECT_TRUE(c["host_links"].empty());
  // A 2-rank all-reduce's bus bandwidth is its algorithm bandwidth (each rank sends and
  // receives half the buffer twice): at most the shaped 12.5 MB/s, and shared memory is more
  // than 10 times that.
  const double inter = c["inter_bytes_per_s"].get<double>(),
               intra = c["intra_bytes_per_s"].get<double>();
  EXPECT_LT(inter, 12.5e6 * 1.1) << r.output;
  EXPECT_GT(intra, 10 * inter) << r.output;
  // The link between hosts by size (--quick: 1 KiB to 1 MiB in x4 steps), over the 2 hosts.
  // A 2-rank all-reduce sends the whole buffer each way; the shaper lets its 256 KiB burst
  // pass at line rate (so the small sizes are not bound), the rest at 12.5 MB/s: 1 MiB takes
  // at least 63 ms. The largest takes longer than the smallest.
  const nlohmann::json& curve = c["inter_curve"];
  ASSERT_TRUE(curve.is_object()) << c.dump();
  EXPECT_EQ(curve["ranks"].get<int>(), 2);
  const auto bytes = curve["bytes"].get<std::vector<double>>();
  const auto secs = curve["seconds"].get<std::vector<double>>();
  EXPECT_EQ(bytes, (std::vector<double>{1024, 4096, 16384, 65536, 262144, 1048576}));
  ASSERT_EQ(secs.size(), bytes.size());
  EXPECT_GE(secs.back(), (1048576 - 262144) / 12.5e6) << curve.dump();
  EXPECT_GT(secs.back(), secs.front()) << curve.dump();
  auto predict = [&](const std::string& extra) {
    // (appended piece by piece: GCC 12's -Wrestrict misfires on "(" + std::string)
    std::string cmd = "(";
    cmd += MT_BINARY;
    cmd += " plan --cluster " + cluster +
           " --model tiny --batch 8 --gpus 4 --dp 2 --tp 2 --pp 1 --zero 0 --microbatch 4 "
           "--recompute none --no-sp --dtype f32 --meshtrain-runtime --json " +
           extra + " 2>/dev/null)";
    const RunResult p = run_command(cmd);
    EXPECT_EQ(p.exit_code, 0) << p.output;
    const size_t at = p.output.find('{');
    const nlohmann::json j = nlohmann::json::parse(
        at == std::string::npos ? std::string() : p.output.substr(at), nullptr, false);
    return j.is_object() ? j["layouts"][0]["step_time_s"].get<double>() : -1.0;
  };
  EXPECT_GT(predict("--tp-across-hosts"), predict("")) << r.output;
}

// `hosts.sh shape --rate 1gbit --delay 10ms`: a round trip between two hosts (a TCP connect,
// `hosts.sh rtt`) takes at least 2 x 10 ms (the SYN held 10 ms into one host, the SYN-ACK
// 10 ms into the other), and `--rate off` removes the delay again.
TEST_F(NamespaceHosts, AShapedLinkDelaysEveryPacketBetweenHosts) {
  make_hosts(2, 1);
  if (IsSkipped()) return;
  // The smallest of 5 round trips in ms, host 0 -> host 1.
  auto rtt_ms = [&] {
    const RunResult r = run_command(kHosts + " rtt " + prefix_ + "-h0 " + prefix_ +
                                    "-h1 --prefix " + prefix_ + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.exit_code == 0 ? std::stod(r.output) : -1.0;
  };
  // Unshaped a veth round trip is about 0.03 ms; 5 ms leaves room for a loaded machine and
  // is still below a quarter of the delayed one.
  const double before = rtt_ms();
  EXPECT_GE(before, 0);
  EXPECT_LT(before, 5);
  const RunResult s = run_command(kHosts + " shape --rate 1gbit --delay 10ms --prefix " + prefix_);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  // 20 ms is a hard floor (each packet is held 10 ms); above it the delay line's wake-up
  // (0.3 ms measured) and a loaded machine's scheduling: the smallest of 5 within 15 ms more.
  const double shaped = rtt_ms();
  EXPECT_GE(shaped, 20) << "the delay is not applied";
  EXPECT_LT(shaped, 35);
  // The delay line is outside the hosts: `kill` of a host's processes leaves it running.
  ASSERT_EQ(run_command(kHosts + " kill " + prefix_ + "-h1 --prefix " + prefix_).exit_code, 0);
  EXPECT_GE(rtt_ms(), 20) << "the delay went with the host's processes";
  ASSERT_EQ(run_command(kHosts + " shape --rate off --prefix " + prefix_).exit_code, 0);
  EXPECT_LT(rtt_ms(), 5) << "'--rate off' left a delay";
}

// Issue 27, diagnosis: a host cut off mid-run (its link down) is named, host and ranks, by
// the watchdog within --comm-timeout + 5 s, in the log of every rank on the other hosts.
TEST_F(NamespaceHosts, ACutOffHostIsNamedInEverySurvivorsLog) {
  make_hosts(4, 2);
  if (IsSkipped()) return;
  const std::string metrics = (scratch_dir("multihost-cut") / "m.jsonl").string();
  const std::filesystem::path logs = scratch_dir("multihost-cut-logs");
  const double timeout_s = 4;
  // In the background; its process id on stdout (its session: mpirun and every process of
  // the job; the 900 s limit only for a test killed before it ends them).
  const RunResult bg = run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 setsid timeout 900 mpirun "
      "--oversubscribe " +
      mpirun_args_ + " --output-filename " + logs.string() + " -np 8 " + MT_BINARY +
      " train --model tiny --n-layer 2 --seq 32 --batch 8 --threads 1 --steps 100000 "
      "--dp 4 --tp 2 --comm-timeout 4 --metrics " +
      metrics + " --data " + data() + " >/dev/null 2>&1 & echo $!");
  ASSERT_EQ(bg.exit_code, 0) << bg.output;
  const std::string pid = bg.output.substr(0, bg.output.find('\n'));
  struct EndJob {  // mpirun, if a lost daemon holds it, and every process of the job
    std::string pid;
    ~EndJob() { run_command("kill -9 -" + pid + " 2>/dev/null"); }
  } end_job{pid};
  auto wait_for = [](const std::function<bool()>& done, double deadline_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return true;
  };
  // Mid-run: after the second step's metrics line. Alone the run gets there in about 5 s; on
  // a loaded machine (ctest -j2 beside other tests of 8 ranks) far later, so the wait is on
  // progress, not on a fixed time: it goes on while the job is alive and its output (the
  // ranks' logs, the metrics) grows at least once every 180 s, and fails at once when mpirun
  // is gone, after 180 s without any output, or after 600 s in all.
  std::string stalled;
  const bool running = [&] {
    auto output_bytes = [&] {
      uintmax_t n = 0;
      std::error_code ec;
      for (auto it = std::filesystem::recursive_directory_iterator(logs, ec);
           !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file(ec)) n += it->file_size(ec);
      return n + slurp(metrics).size();
    };
    const auto begin = std::chrono::steady_clock::now();
    auto last_change = begin;
    uintmax_t last_bytes = output_bytes();
    while (slurp(metrics).find("\"step\":2") == std::string::npos) {
      const auto now = std::chrono::steady_clock::now();
      const double idle_s = std::chrono::duration<double>(now - last_change).count(),
                   all_s = std::chrono::duration<double>(now - begin).count();
      if (run_command("kill -0 " + pid + " 2>/dev/null").exit_code != 0)
        stalled = "mpirun ended first";
      else if (idle_s > 180)
        stalled = "no output from the job for 180 s";
      else if (all_s > 600)
        stalled = "600 s passed";
      if (!stalled.empty()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (const uintmax_t b = output_bytes(); b != last_bytes) {
        last_bytes = b;
        last_change = std::chrono::steady_clock::now();
      }
    }
    return true;
  }();
  ASSERT_TRUE(running) << "the run did not reach step 2 (" << stalled << "):\n"
                       << slurp(metrics) << "\nrank 0's log:\n"
                       << slurp(logs / "1" / "rank.0" / "stderr");
  const std::string host = prefix_ + "-h3";
  ASSERT_EQ(run_command(kHosts + " cut " + host + " --prefix " + prefix_).exit_code, 0);
  const auto cut_at = std::chrono::steady_clock::now();
  // Every survivor's log (mpirun --output-filename: DIR/1/rank.R/stderr) names the host.
  const std::string named = host + " (ranks 6, 7)";
  std::vector<double> seen_s(6, -1);
  wait_for(
      [&] {
        bool all = true;
        for (int r = 0; r < 6; ++r) {
          if (seen_s[r] < 0 &&
              slurp(logs / "1" / ("rank." + std::to_string(r)) / "stderr").find(named) !=
                  std::string::npos)
            seen_s[r] =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - cut_at).count();
          all = all && seen_s[r] >= 0;
        }
        return all;
      },
      timeout_s + 30);
  for (int r = 0; r < 6; ++r) {
    const std::string log = slurp(logs / "1" / ("rank." + std::to_string(r)) / "stderr");
    EXPECT_GE(seen_s[r], 0) << "rank " << r << "'s log does not name " << named << ":\n" << log;
    // The bound of the issue: --comm-timeout + 5 s (plus the 50 ms polling of this test).
    EXPECT_LE(seen_s[r], timeout_s + 5 + 0.1) << "rank " << r << ":\n" << log;
  }
}

// The step rows of a metrics file: step -> loss, and how many rows each step has; the
// restart records (event rows).
struct MetricsRows {
  std::map<int64_t, double> loss;
  std::map<int64_t, int> count;
  std::vector<nlohmann::json> restarts;
};
MetricsRows read_metrics(const std::string& path) {
  MetricsRows m;
  std::istringstream in(slurp(path));
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (!row.is_object()) continue;
    if (row.contains("event")) m.restarts.push_back(row);
    if (!row.contains("step") || !row.contains("loss")) continue;
    m.loss[row["step"].get<int64_t>()] = row["loss"].get<double>();
    ++m.count[row["step"].get<int64_t>()];
  }
  return m;
}

// Elastic restart (issue 27): dp 3 x tp 2 on 3 hosts of 2 ranks; faults are injected one
// after the other (a host's link cut, its processes SIGKILLed; mid-step or while a checkpoint
// is being written) and a cut link healed; `meshtrain launch` restarts the job on the hosts
// that answer, in the largest layout that fits, from the newest valid checkpoint, and grows
// back when a host answers again. The run ends with the uninterrupted run's losses, every
// step once in its metrics, one restart record per fault (a heal included).
struct Fault {
  std::string command;  // hosts.sh cut / kill / heal
  int host;             // its index
  int at_step;          // once the metrics show this step (or, during_save, a save of it or later)
  bool during_save;     // while a checkpoint (step >= at_step) is being written: its .tmp is there
  // Only once the restart after the fault before has rewritten the metrics file (fewer step
  // rows than when that fault came): a fault before any checkpoint, whose steps come again.
  bool after_rewrite = false;
  // Only once the launcher has restarted the job after the fault before (its log names the
  // restart at the new job's first step): a heal must not come before the cut was noticed.
  // Under load the cut command can take effect steps late, and a heal at a fixed step then
  // ended a cut of a few hundred ms that TCP rode through, with no restart (a CI run).
  bool after_restart = false;
};

// The job's batch and layout: its flags (besides --dp, which launch sets) and the first dp,
// and what the last restart must have kept.
struct JobLayout {
  std::string flags = "--batch 12 --microbatch 2 --tp 2";
  int first_dp = 3;
  int cp = 1, ep = 1;
  int steps = 20;
  int checkpoint_every = 4;
};

class Elastic : public NamespaceHosts {
 protected:
  // A batch of 96 (16 or 24 microbatches per replica): a step of about 0.1 s. With the ranks
  // yielding when idle a step of the default batch of 12 takes about 10 ms, faster than a
  // fault can be aimed between two steps (the test polls the metrics and starts hosts.sh)
  // or than the launcher sees a healed host (its 0.1 s polls): for the tests whose fault
  // must land before a given step, or whose job must still be training some time after it.
  static JobLayout slow_job() {
    JobLayout job;
    job.flags = "--batch 96 --microbatch 2 --tp 2";
    return job;
  }
  std::string train_args(const std::string& data, const JobLayout& job) {
    return "train --model tiny --n-layer 2 --seq 64 --threads 1 " + job.flags +
           " --lr 1e-3 --steps " + std::to_string(job.steps) + " --data " + data;
  }
  // A save of step >= `step` in progress in `ck` (its step-N.tmp folder exists).
  static bool saving(const std::filesystem::path& ck, int step) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(ck, ec)) {
      const std::string n = e.path().filename().string();
      if (n.size() > 9 && n.rfind("step-", 0) == 0 && n.substr(n.size() - 4) == ".tmp" &&
          std::atoi(n.c_str() + 5) >= step)
        return true;
    }
    return false;
  }
  // After the last restart: dp `dp` on hosts `left` (their indices).
  void run_with_faults(const std::vector<Fault>& faults, int dp, const std::vector<int>& left,
                       const JobLayout& job = {}) {
    make_hosts(3, 2);
    if (IsSkipped()) return;
    std::string expect;
    for (int i : left)
      expect += (expect.empty() ? "\"" : ",\"") + prefix_ + "-h" + std::to_string(i) + "\"";
    expect = std::to_string(dp) + " [" + expect + "]";
    const std::string d = data();
    const std::filesystem::path dir = scratch_dir("multihost-elastic"), ck = dir / "ck";
    const std::string metrics = (dir / "m.jsonl").string(), ref = (dir / "ref.jsonl").string();
    // The uninterrupted run (rank threads, the first layout).
    const RunResult base = run_meshtrain(train_args(d, job) + " --dp " +
                                         std::to_string(job.first_dp) + " --metrics " + ref);
    ASSERT_EQ(base.exit_code, 0) << base.output;
    const std::string probe = kHosts + " probe --prefix " + prefix_;
    const std::string fence = kHosts + " kill --prefix " + prefix_;
    const RunResult args = run_command(kHosts + " mpirun-args --no-hostfile --prefix " + prefix_);
    const std::string opts = args.output.substr(0, args.output.find('\n'));
    const std::string log = (dir / "launch.log").string();
    // A fault during a save: rank 0 pauses in the save of exactly its step, which must be a
    // checkpoint step (once: the restarted job's saves go on), so the save's .tmp folder is
    // there for seconds. A 5 MB save
    // takes 40-60 ms, and on loaded cores the 10 ms poll below missed every one of them (a CI
    // run, 2026-11-29: "the run ended first").
    std::string pause;
    for (const Fault& f : faults)
      if (f.during_save)
        pause = " -x MESHTRAIN_FAULT=pause@save-shards:" + std::to_string(f.at_step) +
                ":0:" + (dir / "pause-once").string();
    std::string hostfile = run_command(kHosts + " hostfile --prefix " + prefix_).output;
    hostfile = hostfile.substr(0, hostfile.find('\n'));
    const RunResult bg = run_command(
        "(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 setsid timeout 300 " +
        std::string(MT_BINARY) + " launch --hostfile " + hostfile + " --probe '" + probe +
        "' --fence '" + fence + "' --hang-grace 3 --max-restarts " + std::to_string(faults.size()) +
        " --log " + log + " --mpirun-args='--oversubscribe " + opts + pause + "' -- " +
        train_args(d, job) +
        // 15 s: a cut link is found by the watchdog; under ctest -j2 on 2 cores a healthy
        // tp all-reduce was seen to wait 4.4 s for ranks slowed by the load (a false
        // alarm at 4 s that ended the restarted job).
        " --comm-timeout 15 --checkpoint-dir " + ck.string() + " --checkpoint-every " +
        std::to_string(job.checkpoint_every) + " --resume auto --metrics " + metrics + " > " +
        (dir / "out").string() + " 2>&1; echo $? > " + (dir / "rc").string() +
        ") >/dev/null 2>&1 & echo");
    ASSERT_EQ(bg.exit_code, 0) << bg.output;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    auto finished = [&] { return !slurp(dir / "rc").empty(); };
    int injected = 0;
    size_t rows_at_fault = 0;  // step rows in the metrics file when the fault before came
    for (const Fault& f : faults) {
      while (f.after_rewrite && !finished() && std::chrono::steady_clock::now() < deadline &&
             read_metrics(metrics).loss.size() >= rows_at_fault)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      while (f.after_restart && !finished() && std::chrono::steady_clock::now() < deadline &&
             slurp(log).find("launch: restart " + std::to_string(injected) + ":") ==
                 std::string::npos)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      while (!finished() && std::chrono::steady_clock::now() < deadline &&
             !(f.during_save ? saving(ck, f.at_step)
                             : read_metrics(metrics).loss.count(f.at_step) > 0))
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (finished()) break;
      rows_at_fault = read_metrics(metrics).loss.size();
      const RunResult r = run_command(f.command + " " + prefix_ + "-h" + std::to_string(f.host) +
                                      " --prefix " + prefix_);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      ++injected;
    }
    while (!finished() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string out = slurp(dir / "out") + slurp(log);
    ASSERT_EQ(injected, static_cast<int>(faults.size())) << "the run ended first\n" << out;
    ASSERT_EQ(slurp(dir / "rc"), "0\n") << out;
    const MetricsRows m = read_metrics(metrics), r = read_metrics(ref);
    // Every step once.
    ASSERT_EQ(m.loss.size(), static_cast<size_t>(job.steps)) << out;
    for (const auto& [step, n] : m.count) EXPECT_EQ(n, 1) << "step " << step << " twice\n" << out;
    ASSERT_EQ(m.restarts.size(), faults.size()) << out;
    const nlohmann::json& last = m.restarts.back();
    EXPECT_EQ(last["layout"]["dp"].dump() + " " + last["hosts"].dump(), expect) << out;
    EXPECT_EQ(last["layout"]["cp"], job.cp) << out;
    EXPECT_EQ(last["layout"]["ep"], job.ep) << out;
    for (size_t k = 1; k <= faults.size(); ++k)
      EXPECT_NE(slurp(log).find("launch: restart " + std::to_string(k) + ":"), std::string::npos)
          << out;
    // The recovery time of each restart, split (detection, restart, resharded load).
    for (const nlohmann::json& rec : m.restarts) {
      EXPECT_GE(rec["detect_s"].get<double>(), 0) << rec.dump();
      EXPECT_TRUE(rec["restart_s"].is_number()) << rec.dump();
      EXPECT_TRUE(rec["load_s"].is_number()) << rec.dump();
      // Growing stops the job after a step with a checkpoint of it: nothing trained again.
      if (rec["reason"] == "grow") {
        EXPECT_EQ(rec["steps_lost"], 0) << rec.dump();
      }
    }
    // Each restart after the first checkpoint resumed from a checkpoint the trainer found
    // complete and valid (index, sizes, CRC32C: a save cut off left only its .tmp, which is
    // never read); one before it started afresh.
    size_t resumed = 0, from_checkpoint = 0;
    for (size_t at = out.find("resumed from checkpoint"); at != std::string::npos;
         at = out.find("resumed from checkpoint", at + 1))
      ++resumed;
    for (const nlohmann::json& rec : m.restarts) from_checkpoint += rec["from_step"] > 0;
    EXPECT_EQ(resumed, from_checkpoint) << out;
    // The loss of every step against the uninterrupted run: a layout change reorders f32
    // sums only (verify's default loss tolerance, 2e-6 relative: 8x the worst measured over
    // 20 steps, docs/verify.md).
    double worst = 0;
    for (const auto& [step, loss] : r.loss) {
      EXPECT_NEAR(m.loss.at(step), loss, 2e-6 * loss) << "step " << step << "\n" << out;
      worst = std::max(worst, std::abs(m.loss.at(step) - loss) / loss);
    }
    std::printf(
        "%s%d fault(s) injected, %zu restart(s); worst loss difference to the "
        "uninterrupted run: %.3g relative\n",
        slurp(log).c_str(), injected, m.restarts.size(), worst);
  }
};

// The slow job here and below wherever a fault is aimed at a step: in CI (2026-11-28) the
// default job's 10 ms steps ran all 20 before the cut aimed after step 6 took effect; the
// restart then had no step to train (from the checkpoint of step 20, no resharded load).
TEST_F(Elastic, AHostCutOffMidStepShrinksDp) {
  run_with_faults({{kHosts + " cut", 2, 6, false}}, 2, {0, 1}, slow_job());
}

TEST_F(Elastic, AHostsProcessesKilledRestartInTheSameLayout) {
  run_with_faults({{kHosts + " kill", 2, 6, false}}, 3, {0, 1, 2}, slow_job());
}

// The save in progress when its host is cut off never completes: the restart goes on from
// the one before (checked above: every restart's checkpoint has its index).
TEST_F(Elastic, AHostCutOffDuringACheckpointSave) {
  run_with_faults({{kHosts + " cut", 1, 8, true}}, 2, {0, 2});
}

// Two failures before the first checkpoint (step 4): each restart starts the job afresh, and
// the final metrics still hold both restart records (the trainer began the file anew each
// time; launch appends the records the file lacks).
TEST_F(Elastic, FailuresBeforeTheFirstCheckpointKeepTheirRecords) {
  // The slow job, its first checkpoint at step 10: each kill, aimed at step 1, must land
  // before it. With the checkpoint at step 4 the margin was 3 steps, and CI runs on loaded
  // cores saw a kill aimed at step 2 (2026-11-28), and one aimed at step 1 (2026-11-29: steps
  // of 130-390 ms), land after step 4: the restart began from that checkpoint and the run
  // ended before the second kill came.
  JobLayout job = slow_job();
  job.checkpoint_every = 10;
  run_with_faults({{kHosts + " kill", 2, 1, false}, {kHosts + " kill", 2, 1, false, true}}, 3,
                  {0, 1, 2}, job);
}

// A job with context parallelism: cp 2 is kept (a host holds one cp pair), dp shrinks.
TEST_F(Elastic, CpIsKeptWhileDpShrinks) {
  run_with_faults({{kHosts + " cut", 2, 6, false}}, 2, {0, 1},
                  {"--batch 96 --microbatch 2 --tp 1 --cp 2", 3, 2, 1});
}

// A job with expert parallelism (4 experts over ep 2, carved from dp 6; dropless, so no
// capacity depends on which microbatches meet in an ep group): a lost host leaves 4 slots,
// dp 4 (a multiple of ep 2) with ep 2 kept.
TEST_F(Elastic, EpIsKeptWhileDpShrinks) {
  run_with_faults({{kHosts + " cut", 2, 6, false}}, 4, {0, 1},
                  {"--batch 96 --microbatch 2 --tp 1 --moe-experts 4 --moe-capacity-factor 0 "
                   "--ep 2",
                   6, 1, 2});
}

// The second cut comes once the first restart has trained up to step 14. The slow job: with
// the default one's 10 ms steps the restarted job was seen at step 15 when the cut took
// effect, and 6 steps from the end a cut can come after the last step (the test failed once
// in a serial run of the multihost label; its output was lost, so this is the likely cause,
// not a proven one).
TEST_F(Elastic, TwoHostsLostOneAfterTheOther) {
  run_with_faults({{kHosts + " cut", 2, 6, false}, {kHosts + " cut", 1, 14, false}}, 1, {0},
                  slow_job());
}

// Growing back: host 2 cut at step 6 (dp 2 on the two left, from the checkpoint of step 4),
// healed once the restarted, smaller job has trained step 8; the launcher stops the job after
// its step (a checkpoint) and goes on in dp 3 on all three hosts, with no step lost. 40 steps:
// the launcher probes lost hosts once a second, so the job must still be training a few
// seconds after the heal.
TEST_F(Elastic, ALostHostThatAnswersAgainIsGrownBackTo) {
  JobLayout job = slow_job();
  job.steps = 40;
  run_with_faults({{kHosts + " cut", 2, 6, false}, {kHosts + " heal", 2, 8, false, false, true}}, 3,
                  {0, 1, 2}, job);
}

}  // namespace
}  // namespace mt::test
