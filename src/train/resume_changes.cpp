#include "train/resume_changes.h"

#include <fmt/format.h>

#include "train/optimizer.h"
#include "train/trainer.h"

namespace mt::train {

std::vector<std::string> resume_changes(const nlohmann::json& t, int64_t step,
                                        const TrainOptions& o) {
  std::vector<std::string> out;
  auto get = [&](const char* key, auto fallback) {
    using V = decltype(fallback);
    try {
      return t.contains(key) ? t.at(key).get<V>() : fallback;
    } catch (const nlohmann::json::exception&) {
      return fallback;  // read_index checked what resuming needs; this is informative
    }
  };
  const auto lr = get("lr", o.lr);
  if (lr != o.lr) {
    const int64_t warmup = o.warmup >= 0 ? o.warmup : o.steps / 20;
    out.push_back(fmt::format(
        "--lr {} differs from the checkpoint's {}: the schedule goes on from step {} with the "
        "new peak (next learning rate {:.3g})",
        o.lr, lr, step + 1, lr_at(step, warmup, o.steps, o.lr, o.min_lr_ratio)));
  }
  const auto seed = get("seed", o.seed);
  if (seed != o.seed)
    out.push_back(fmt::format(
        "--seed {} differs from the checkpoint's {}: the weights are the checkpoint's; {}", o.seed,
        seed,
        o.shuffle ? fmt::format("from step {} on the samples follow the new seed's order "
                                "(not the order the checkpointed run would have read)",
                                step + 1)
                  : std::string("the samples are read in file order, which no seed changes")));
  const auto data = get("data", o.data);
  if (data != o.data)
    out.push_back(fmt::format(
        "--data '{}' differs from the checkpoint's '{}': training goes on with the new data at "
        "global sample {} (step x batch)",
        o.data, data, step * o.batch));
  const auto format = get("data_format", std::string("auto"));
  if (format != o.data_format)
    out.push_back(
        fmt::format("--data-format {} differs from the checkpoint's {}", o.data_format, format));
  // A checkpoint written before --shuffle existed read its data in file order.
  const bool shuffled = get("shuffle", false);
  if (shuffled != o.shuffle)
    out.push_back(fmt::format(
        "{}: the checkpoint's run read its samples {}, this one reads them {} from step {} on",
        o.shuffle ? "--shuffle" : "--no-shuffle", shuffled ? "shuffled" : "in file order",
        o.shuffle ? "shuffled" : "in file order", step + 1));
  return out;
}

}  // namespace mt::train
