// --moe-balance bias (DeepSeek-V3's auxiliary-loss-free balancing): the update rule on a
// step's counters, and on real text that it spreads the load: the experts' coefficient of
// variation falls against the same run without it (no balancing loss in either).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/moe_test_util.h"
#include "train/moe_report.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

TEST(MoeBalance, EachBiasMovesByTheRateTowardsTheMeanLoad) {
  model::GptConfig c = model::preset("mixtral-tiny");
  c.n_layer = 2;
  c.moe.n_experts = 4;
  const int64_t E = 4, per = E + kMoeCounterFields;  // moe_counters' row: E loads, then fields
  std::vector<float> summed(static_cast<size_t>(2 * per), 0.f);
  const float loads[2][4] = {{3, 1, 2, 2}, {0, 0, 0, 8}};
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 4; ++e) summed[static_cast<size_t>(l * per + e)] = loads[l][e];
  std::vector<float> bias(8, 0.5f);
  update_moe_bias(bias, summed, c, 0.25);
  // Layer 0: mean 2 -> expert 0 above (-), 1 below (+), 2 and 3 at the mean (unchanged).
  EXPECT_EQ(bias, (std::vector<float>{0.25f, 0.75f, 0.5f, 0.5f, 0.75f, 0.75f, 0.75f, 0.25f}));
}

// The worst layer's coefficient of variation of tokens per expert, mean of the last steps.
double late_cv(const std::string& metrics, int last) {
  std::ifstream in(metrics);
  std::vector<double> cv;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    double worst = 0;
    for (const auto& l : row.at("moe").at("layers"))
      worst = std::max(worst, l.at("cv").get<double>());
    cv.push_back(worst);
  }
  double s = 0;
  for (size_t i = cv.size() - static_cast<size_t>(last); i < cv.size(); ++i) s += cv[i];
  return s / last;
}

TEST(MoeBalance, BiasLowersTheSpreadOfTheLoadOnText) {
  double cv[2] = {0, 0};
  for (int with = 0; with < 2; ++with) {
    TrainOptions o = test::moe_options({}, 60, "f32", {});
    o.moe.aux_loss = 0;  // the bias alone
    o.moe.balance_bias = with == 1;
    o.moe.bias_rate = 0.01;
    o.metrics = (test::dir3d() / ("balance" + std::to_string(with) + ".jsonl")).string();
    run_training(o);
    cv[with] = late_cv(o.metrics, 10);
  }
  std::printf(
      "worst layer's CV of tokens per expert, mean of steps 51-60: %.3f without, %.3f "
      "with --moe-balance bias (rate 0.01)\n",
      cv[0], cv[1]);
  EXPECT_LT(cv[1], 0.8 * cv[0]);
}

}  // namespace
}  // namespace mt::train
