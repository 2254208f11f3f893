// The `--config FILE.json` reader of train and verify (cli/model_flags.h read_config_file,
// cli/train_flags.h): the JSON, its keys, each value's type and range as the run options
// take it, then the options' own checks.
#include "cli/train_flags.h"
#include "fuzz.h"
#include "train/trainer.h"

using namespace mt;

MT_FUZZ_TARGET(config_file) {
  const std::string path = fuzz::write_input("config.json", bytes);
  cli::TrainFlags flags;
  flags.config = path;
  nlohmann::json j;
  if (!fuzz::read_or_refuse(path, [&] { j = flags.config_json(cli::train_command_config_keys()); }))
    return;
  train::TrainOptions o;
  // A value's refusal names its key (and the file, cli/train_flags.cpp); a layout's refusal
  // names the flag. Either is a proper refusal.
  if (!fuzz::read_or_refuse("", [&] { flags.apply_to(o, j); })) return;
  fuzz::read_or_refuse("", [&] { o.validate(); });
}
