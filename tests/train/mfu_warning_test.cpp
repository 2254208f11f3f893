// MFU above 100% cannot be: the peak under it is wrong. The trainer says so once, naming the
// peak, where it came from and the fix (train/host_share.h). The usual cause: the CPU peak
// was measured and cached while other work ran beside it, and a cached peak is never
// lowered, so every later run on that machine printed MFU 200-250% (a busy host's cache of
// 25 GFLOP/s was seen in a session).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kernels/peak.h"
#include "test_util.h"
#include "train/host_share.h"

namespace mt::test {
namespace {

namespace fs = std::filesystem;

std::string train(const fs::path& dir, const std::string& env, const std::string& flags) {
  const RunResult r = run_command(env + " " + MT_BINARY +
                                  " train --model tiny --n-layer 2 --seq 32 --batch 8 --steps 2 "
                                  "--threads 1 --data " +
                                  demo_tokens(dir) + " " + flags);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(MfuWarning, ACachedPeakBelowTheRunsRateIsNamedWithItsFix) {
  const fs::path dir = scratch_dir("mfu-warning");
  const fs::path cache = dir / "cache";
  fs::create_directories(cache / "meshtrain");
  // A peak of 1 MFLOP/s for this CPU at 1 thread: what a measurement on a starved core gives.
  std::ofstream(cache / "meshtrain" / "peak.json")
      << R"({"cpu": ")" << kernels::cpu_identity() << R"(", "f32": {"1": 1e6}})";
  const std::string out = train(dir, "XDG_CACHE_HOME=" + cache.string(), "");
  EXPECT_EQ(count(out, "warning: MFU"), 1u) << out;  // once, not every step
  EXPECT_NE(out.find("is impossible"), std::string::npos) << out;
  EXPECT_NE(out.find((cache / "meshtrain" / "peak.json").string()), std::string::npos) << out;
  EXPECT_NE(out.find("0.0 GFLOP/s"), std::string::npos) << out;
}

TEST(MfuWarning, AGivenPeakTooLowIsNamed) {
  const fs::path dir = scratch_dir("mfu-warning-given");
  const std::string out = train(dir, "", "--peak-gflops 0.001");
  EXPECT_EQ(count(out, "warning: MFU"), 1u) << out;
  EXPECT_NE(out.find("--peak-gflops gives a peak"), std::string::npos) << out;
  // A peak far above the host's: MFU is small and nothing is said.
  const std::string fine = train(dir, "", "--peak-gflops 1000000");
  EXPECT_EQ(fine.find("warning: MFU"), std::string::npos) << fine;
}

TEST(MfuWarning, TheLineNamesTheGpuWhenTheGpuPeakIsLow) {
  const std::string w = train::mfu_above_peak_warning(2.5, {4e12, 0.5, true}, false);
  EXPECT_NE(w.find("MFU 250.0% is impossible"), std::string::npos) << w;
  EXPECT_NE(w.find("GPU peak"), std::string::npos) << w;
  EXPECT_NE(w.find("4000.0 GFLOP/s"), std::string::npos) << w;
}

}  // namespace
}  // namespace mt::test
