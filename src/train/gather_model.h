// The whole model from its pieces, for export (--export) and the tests: the shards of expert,
// tensor and pipeline parallelism gathered onto one rank, and a GPU model's host copy.
#pragma once

#include <memory>

#include "comm/group.h"
#include "model/gpt.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "train/replica.h"
#include "train/trainer.h"

namespace mt::train {

// The rank's (stage) model with every tp shard, as a tp = 1 Gpt; collective over `tp`, the
// model on tp rank 0, null elsewhere.
std::unique_ptr<model::Gpt> gather_tp_shards(const model::Gpt& gpt, comm::Group& tp,
                                             const model::GptConfig& config, uint64_t seed);
// The rank's (stage, tp-sharded) model with all its experts, as an ep = 1 Gpt; collective over
// `ep`, the model on ep rank 0, null elsewhere.
std::unique_ptr<model::Gpt> gather_ep_shards(const model::Gpt& gpt, comm::Group& ep,
                                             const model::GptConfig& config, uint64_t seed);
// The whole model on world rank 0 (null elsewhere): ZeRO-3 shards over dp, experts over ep,
// tp shards, then the pipeline stages. Collective over every rank.
std::unique_ptr<model::Gpt> gather_whole_model(Replica& rep, comm::Group& tp_group,
                                               comm::Group& ppg, const TrainOptions& o,
                                               const parallel::pp::Schedule* sched,
                                               const parallel::pp::Partition* part);
// A host copy of a GPU rank's whole model (tp = pp = 1), for export.
std::unique_ptr<model::Gpt> host_copy(const model::Gpt& gpt, const TrainOptions& o);

}  // namespace mt::train
