// The training and validation splits of a run's data (--data, --val-data, --data-format,
// --shuffle): the corpora, opened once and shared read-only by the rank threads, and their
// samplers. Without --val-data the last val_fraction of --data's sequences is held out
// (before shuffling: the held-out sequences never train). Training samples follow the
// run's SampleOrder (seeded by --seed); validation reads its split in order.
#pragma once

#include <memory>

#include "obs/metrics.h"
#include "train/token_corpus.h"

namespace mt::train {

struct TrainOptions;

struct Splits {
  std::unique_ptr<TokenCorpus> train_data, val_data;
  std::unique_ptr<SequenceSampler> train, val;
};

// The order of the training samples that the options ask for.
SampleOrder sample_order(const TrainOptions& o);

Splits make_splits(const TrainOptions& o);

// Data too small for what was asked trains anyway, but not silently.
void warn_about_small_data(const TrainOptions& o, const Splits& data, obs::Progress& progress);

}  // namespace mt::train
