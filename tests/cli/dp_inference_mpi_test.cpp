// Under mpirun (-np 8, tests/CMakeLists.txt): the train command without --dp, parsed and run
// by the CLI's own code in each process, takes dp = processes / (tp x pp) = 8, as Megatron-LM
// and torchtitan do, and trains the single rank's model (shuffled samples included): the
// losses match the single-rank run within the DP tolerance of dp_mpi_test.cpp (only the order
// of the f32 gradient sums differs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "comm/launch.h"
#include "comm/mpi.h"
#include "test_util.h"
#include "tiny_run.h"

namespace mt {
namespace {

TEST(DpInferenceMpi, TrainWithoutDpTakesTheProcessCount) {
  ASSERT_TRUE(comm::started_by_mpirun()) << "run under mpirun";
  const int world = comm::mpi_env_world_size(), rank = comm::mpi_env_world_rank();
  ASSERT_EQ(8 % world, 0) << "the batch of 8 must divide over " << world << " processes";
  const auto dir = test::scratch_dir("dp_inference");
  const std::string data = test::demo_tokens(dir), metrics = (dir / "m.jsonl").string();
  CLI::App app;
  cli::register_train(app);
  app.parse(
      "train --model tiny --n-layer 2 --seq 32 --batch 8 --steps 3 --threads 1 "
      "--peak-gflops 100 --data " +
          data + " --metrics " + metrics,
      false);
  if (rank != 0) return;
  std::vector<float> losses;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    losses.push_back(row.at("loss").get<float>());
    // dp 8: every step's gradients were reduced over the dp group.
    EXPECT_GT(row.at("dp_bytes").get<double>(), 0) << line;
  }
  train::TrainOptions one = test::tiny_run(data, 3, 32, 8);
  one.model.n_layer = 2;
  one.backend = "local";  // the 1-rank oracle in this process, as dp_mpi_test.cpp
  const train::TrainResult ref = train::run_training(one);
  ASSERT_EQ(losses.size(), ref.steps.size());
  double worst = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], ref.steps[i].loss, 5e-5) << "step " << i + 1;
    worst = std::max(worst, std::abs(double(losses[i]) - ref.steps[i].loss));
  }
  std::printf("train under mpirun -np %d without --dp: dp %d, max |loss - single rank| %.2e\n",
              world, world, worst);
}

}  // namespace
}  // namespace mt
