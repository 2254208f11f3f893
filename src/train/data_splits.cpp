#include "train/data_splits.h"

#include <fmt/format.h>

#include <cmath>

#include "train/trainer.h"

namespace mt::train {

SampleOrder sample_order(const TrainOptions& o) { return SampleOrder{o.shuffle, o.seed}; }

Splits make_splits(const TrainOptions& o) {
  const int64_t T = o.model.seq_len;
  const DataFormat format = parse_data_format(o.data_format);
  Splits s;
  s.train_data = std::make_unique<TokenCorpus>(o.data, o.model.vocab, format);
  const int64_t total = (s.train_data->num_tokens() - 1) / T;
  if (!o.val_data.empty()) {
    s.val_data = std::make_unique<TokenCorpus>(o.val_data, o.model.vocab, format);
    s.train = std::make_unique<SequenceSampler>(*s.train_data, T, 0, total, sample_order(o));
    s.val =
        std::make_unique<SequenceSampler>(*s.val_data, T, 0, (s.val_data->num_tokens() - 1) / T);
    return s;
  }
  // Hold out the last val_fraction of the sequences (at least one when there are two).
  int64_t held = static_cast<int64_t>(std::floor(total * o.val_fraction));
  if (o.val_fraction > 0 && held == 0 && total >= 2) held = 1;
  s.train = std::make_unique<SequenceSampler>(*s.train_data, T, 0, total - held, sample_order(o));
  if (held > 0) s.val = std::make_unique<SequenceSampler>(*s.train_data, T, total - held, held);
  return s;
}

void warn_about_small_data(const TrainOptions& o, const Splits& data, obs::Progress& progress) {
  if (data.train->num_samples() < o.batch)
    progress.line(fmt::format(
        "warning: the training split holds {} sequence(s) of {} tokens, fewer than --batch {}: "
        "every step repeats sequences (use more data, a smaller --batch or a shorter --seq)",
        data.train->num_samples(), o.model.seq_len, o.batch));
  if (!data.val)
    progress.line(fmt::format(
        "warning: no validation loss: {} holds too few sequences of {} tokens to hold one out "
        "(give --val-data FILE, more data or a shorter --seq)",
        o.data, o.model.seq_len));
  else if (data.val->num_samples() < o.batch)
    progress.line(fmt::format(
        "warning: the validation split holds {} sequence(s), fewer than --batch {}: each "
        "validation batch repeats them",
        data.val->num_samples(), o.batch));
}

}  // namespace mt::train
