// `meshtrain train`: a preset or a JSON config, every field overridable by a flag.
#include <memory>

#include "cli/commands.h"
#include "cli/memory_check.h"
#include "cli/train_command.h"
#include "comm/mpi.h"
#include "core/error.h"
#include "train/stop_signals.h"
#include "train/trainer.h"

namespace mt::cli {

void register_train(CLI::App& app) {
  auto f = std::make_shared<TrainCommandFlags>();
  CLI::App* cmd = app.add_subcommand("train", "train a GPT-2 or Llama-family model");
  add_train_command_flags(*cmd, *f);
  cmd->callback([f] {
    const train::TrainOptions o = train_command_options(*f);
    // Any local job under mpirun, even of one rank: every process writes the same files.
    if (o.backend == "local") train::refuse_local_backend_under_mpirun();
    o.validate();
    check_memory_fits(o);  // before anything is allocated: refuses a run that cannot fit
    // SIGINT, SIGTERM, SIGUSR1: finish the step, save, exit 3 (train/stop_signals.h).
    const train::StopSignals signals(/*announce=*/comm::mpi_env_world_rank() <= 0);
    const train::TrainResult r = train::run_training(o);
    if (r.stop_signal != 0) throw Error(r.stop_message, ExitCode::kStopped);
  });
}

}  // namespace mt::cli
