// What a resumed run does differently from the run that wrote its checkpoint (the
// checkpoint's "trainer" record against this run's options), one sentence per change:
// --lr (allowed: the schedule goes on at the new peak), --seed (the sample order from here
// on), --data, --data-format, --shuffle. `train --resume` prints them, so a changed command
// line never changes a run without a word.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mt::train {

struct TrainOptions;

// `trainer`: the checkpoint index's "trainer" object; `step`: the steps it holds.
std::vector<std::string> resume_changes(const nlohmann::json& trainer, int64_t step,
                                        const TrainOptions& o);

}  // namespace mt::train
