// `meshtrain verify`: a dp and a tp layout PASS against the oracle; a real divergence (the
// layout trained from another seed) and a demand for bitwise equality where the reduction
// order differs FAIL with exit 1; bad flags are refused with exit 2 before any work.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace mt::test {
namespace {

const std::string& data() {
  static const std::string path = demo_tokens(scratch_dir("verify"));
  return path;
}

// Small enough that both runs take about a second on one thread.
std::string small_verify(int steps = 5) {
  return "verify --model tiny --n-layer 2 --seq 32 --batch 8 --threads 1 --steps " +
         std::to_string(steps) + " --data " + data();
}

TEST(VerifyCli, DataParallelPasses) {
  const RunResult r = run_meshtrain(small_verify() + " --dp 2 --zero 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("verify: dp 2 (ZeRO-1) against the oracle"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("oracle loss | layout loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("largest parameter difference"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nPASS\n"), std::string::npos) << r.output;
}

// Mixture of experts in f32 (docs/verify.md, "Gradient spikes"): issue 25's dp 2 x ep 2 run
// meets a gradient spike at step 15 that takes every layout's grad norm past the dense 1e-4
// (3.9e-4 here, tp 2 6.5e-4) with the loss within 1.3e-6: it PASSes on the MoE norm bound,
// and the bound is MoE's only (a dense model keeps 1e-4).
TEST(VerifyCli, MixtureOfExpertsPassesThroughAGradientSpike) {
  const std::string run =
      "verify --model mixtral-tiny --data " + data() + " --dp 2 --ep 2 --steps 20 --batch 8";
  const RunResult r = run_meshtrain(run);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("relative (5e-03)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nPASS\n"), std::string::npos) << r.output;
  const RunResult dense = run_meshtrain(small_verify() + " --dp 2");
  EXPECT_NE(dense.output.find("relative (1e-04)"), std::string::npos) << dense.output;
}

// Context parallelism (docs/context_parallel.md): the layout on the blockwise kernel against
// the oracle on the naive one, in f32 and with bf16 GEMMs.
TEST(VerifyCli, ContextParallelPasses) {
  const RunResult r = run_meshtrain(small_verify(20) + " --cp 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("verify: cp 2 (ring) against the oracle"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nPASS\n"), std::string::npos) << r.output;
  const RunResult b =
      run_meshtrain(small_verify() + " --cp 2 --cp-comm all-gather --dp 2 --zero 1 --dtype bf16");
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("\nPASS\n"), std::string::npos) << b.output;
  const RunResult a2a = run_meshtrain(small_verify() + " --cp 2 --cp-comm a2a");
  EXPECT_EQ(a2a.exit_code, 0) << a2a.output;
  EXPECT_NE(a2a.output.find("\nPASS\n"), std::string::npos) << a2a.output;
  const RunResult bad = run_meshtrain(small_verify() + " --cp 3");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--seq 32 is not divisible by 2 x --cp 3 = 6"), std::string::npos)
      << bad.output;
}

// A 3D layout (dp 2 x tp 2 x pp 2 with ZeRO-3 and recomputation), in f32 and in bf16 (the
// oracle in bf16 too, with the bf16 default tolerances; a 0 tolerance still fails).
TEST(VerifyCli, ThreeDimensionalLayoutPassesInF32AndBf16) {
  const std::string layout =
      " --dp 2 --tp 2 --pp 2 --zero 3 --microbatches 2 "
      "--recompute full";
  const RunResult f32 = run_meshtrain(small_verify() + layout);
  EXPECT_EQ(f32.exit_code, 0) << f32.output;
  EXPECT_NE(f32.output.find("pp 2 (1f1b, 2 microbatches)"), std::string::npos) << f32.output;
  const RunResult bf16 = run_meshtrain(small_verify() + layout + " --dtype bf16");
  EXPECT_EQ(bf16.exit_code, 0) << bf16.output;
  EXPECT_NE(bf16.output.find("(tolerance 3e-03)"), std::string::npos) << bf16.output;
  // bf16's weight check is the update check (the absolute bound is off).
  EXPECT_NE(bf16.output.find("largest update difference"), std::string::npos) << bf16.output;
  EXPECT_NE(bf16.output.find("tolerance 0.25)"), std::string::npos) << bf16.output;
  const RunResult strict = run_meshtrain(small_verify() + layout + " --dtype bf16 --tol-param 0");
  EXPECT_EQ(strict.exit_code, 1) << strict.output;
}

// --json: one document on stdout (the table goes to stderr), one row per step.
TEST(VerifyCli, TensorParallelWithSpPassesAsJson) {
  const auto out = scratch_dir("verify-json") / "out.json";
  const std::string cmd =
      fmt::format("({} {} --tp 2 --sp --json > {})", MT_BINARY, small_verify(), out.string());
  const RunResult r = run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS"), std::string::npos) << r.output;
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_TRUE(j.at("pass").get<bool>());
  EXPECT_EQ(j.at("tp").get<int>(), 2);
  ASSERT_EQ(j.at("steps").size(), 5u);
  EXPECT_EQ(j.at("steps")[0].at("step").get<int>(), 1);
  EXPECT_FALSE(j.at("params").is_null());
  EXPECT_LE(j.at("params").at("abs_diff").get<double>(),
            j.at("tolerances").at("param_abs").get<double>());
  EXPECT_LE(j.at("params").at("update_rel_diff").get<double>(),
            j.at("tolerances").at("update_rel").get<double>());
}

// A real divergence: the layout initialised from another seed. Every measure is far over.
TEST(VerifyCli, ALayoutThatDivergesFails) {
  const RunResult r = run_meshtrain(small_verify() + " --dp 2 --layout-seed 7");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("FAIL: loss differs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("error: the layout differs from the oracle beyond the tolerances"),
            std::string::npos)
      << r.output;
}

// tp splits each GEMM's reduction over the ranks and sums the gradient norm shard by
// shard, so it is not bitwise the oracle (on this config the final weights differ by
// ~8e-6, the grad norm by ~2e-7 relative): asking for bitwise equality fails.
TEST(VerifyCli, BitwiseEqualityFailsWhereTheReductionOrderDiffers) {
  const RunResult r =
      run_meshtrain(small_verify() + " --tp 2 --tol-loss 0 --tol-norm 0 --tol-param 0");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("FAIL: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(tolerance 0)"), std::string::npos) << r.output;
}

TEST(VerifyCli, BadFlagsAreRefusedBeforeAnyWork) {
  struct Case {
    std::string args, says;
  };
  for (const Case& c : {
           Case{" --tol-loss -1", "--tol-loss -1 must be a finite number >= 0"},
           Case{" --tol-param nan", "--tol-param nan must be a finite number >= 0"},
           Case{" --dp 3", "--batch 8 is not divisible by --dp 3"},
           Case{" --tp 3", "--tp 3 does not divide n_head=4"},
           Case{" --dp 2 --backend mpi", "--backend mpi: verify runs"},
       }) {
    const RunResult r = run_meshtrain(small_verify() + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find("oracle loss"), std::string::npos) << "refused before any work";
  }
  const RunResult r = run_meshtrain(small_verify(0) + " --dp 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--steps 0 must be at least 1"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mt::test
