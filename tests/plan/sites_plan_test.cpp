// The planner's model of training across sites (plan/sites.h, docs/diloco.md "The
// planner"): the exchange, the step times with and without DiLoCo and the H from which the
// link stops being the bottleneck, against the values computed here from the formula; and
// `plan --sites` printing them for the best layout.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "plan/sites.h"
#include "test_util.h"

namespace mt::plan {
namespace {

// A 1e9-parameter model in 4 sites joined by 100 Mbit/s (12.5e6 bytes/s) and 50 ms, a 1.5 s
// step inside a site: one f32 exchange sends 2 x 3 / 4 x 4e9 = 6e9 bytes through each site's
// link, 480 s, plus 6 hops of 50 ms: 480.3 s. Synchronous: 481.8 s a step. DiLoCo H = 50:
// 1.5 + 480.3 / 50 = 11.106 s. H* = ceil(480.3 / 1.5) = ceil(320.2) = 321. In int8 (1 + 4/128
// bytes a value): 1.5 x 1e9 x 1.03125 / 12.5e6 + 0.3 = 124.05 s, H* = ceil(82.7) = 83.
TEST(PlanSites, StepTimesAndTheUnboundHFromTheFormula) {
  const SitesEstimate e = estimate_sites(1.5, 1e9, 4, 4, 4, 50, 12.5e6, 0.05);
  // Each value is a handful of f64 operations on exact inputs: 1e-12 relative.
  EXPECT_NEAR(e.sync_exchange_s, 480.3, 480.3 * 1e-12);
  EXPECT_NEAR(e.outer_exchange_s, 480.3, 480.3 * 1e-12);
  EXPECT_NEAR(e.sync_step_s, 481.8, 481.8 * 1e-12);
  EXPECT_NEAR(e.diloco_step_s, 11.106, 11.106 * 1e-12);
  EXPECT_EQ(e.every_unbound, 321);
  // H* is the smallest H whose amortised exchange fits in an inner step.
  EXPECT_LE(e.outer_exchange_s / 321, e.inside_s);
  EXPECT_GT(e.outer_exchange_s / 320, e.inside_s);
  const SitesEstimate q =
      estimate_sites(1.5, 1e9, 4, outer_bytes_per_value("int8"), 4, 50, 12.5e6, 0.05);
  EXPECT_NEAR(q.outer_exchange_s, 124.05, 124.05 * 1e-12);
  EXPECT_EQ(q.every_unbound, 83);
  EXPECT_EQ(outer_bytes_per_value("bf16"), 2);
  EXPECT_THROW(estimate_sites(1.5, 1e9, 4, 4, 1, 50, 12.5e6, 0.05), Error);
  EXPECT_THROW(estimate_sites(1.5, 1e9, 4, 4, 4, 50, 0, 0.05), Error);
}

// `plan --sites 4 --site-gbps 0.1 --site-latency-ms 50`: the JSON's "sites" is the formula
// applied to the best layout's step time and the model's parameters.
TEST(PlanSites, PlanPrintsTheModelForTheBestLayout) {
  const test::RunResult r = test::run_command(
      "sh -c '" + std::string(MT_BINARY) +
      " plan --model gpt2-124m --cluster dgx-h100 --gpus 8 --batch 32 --dp 8 --sites 4 "
      "--outer-every 100 --site-gbps 0.1 --site-latency-ms 50 --json 2>/dev/null'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_TRUE(j.contains("sites")) << r.output;
  const nlohmann::json& s = j["sites"];
  const double step = j["layouts"][0]["step_time_s"], params = j["job"]["model"]["params"];
  const double exchange = 2.0 * 3 / 4 * params * 4 / 12.5e6 + 6 * 0.05;
  EXPECT_NEAR(s["inside_s"].get<double>(), step, step * 1e-12);
  EXPECT_NEAR(s["sync_exchange_s"].get<double>(), exchange, exchange * 1e-12);
  EXPECT_NEAR(s["diloco_step_s"].get<double>(), step + exchange / 100, step * 1e-9);
  EXPECT_EQ(s["every_unbound"].get<int64_t>(), static_cast<int64_t>(std::ceil(exchange / step)));
  // A rank's memory with DiLoCo: the outer state of its shard of the site's parameters (8 / 4 =
  // 2 ranks a site: plan/sites_memory.h, f32 outer parameters, momentum and exchange buffer,
  // 3 x 4 n) on top of its site's model states.
  const nlohmann::json& l = j["layouts"][0];
  ASSERT_EQ(l["dp"].get<int>(), 8) << l.dump();
  const double n = params / (l["tp"].get<int>() * l["pp"].get<int>()) / 2;
  if (l["pp"].get<int>() == 1) {
    EXPECT_NEAR(s["outer_state_bytes"].get<double>(), 12 * n, 12 * n * 1e-12);
  }
  EXPECT_GT(s["memory_bytes"].get<double>(), s["outer_state_bytes"].get<double>());
  const test::RunResult bad = test::run_meshtrain(
      "plan --model gpt2-124m --cluster dgx-h100 --gpus 8 --batch 32 --dp 8 --sites 4");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("site_bytes_per_s, or --site-gbps"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace mt::plan
