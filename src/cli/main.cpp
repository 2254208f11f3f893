#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/suggest.h"
#include "comm/launch.h"
#include "comm/mpi.h"
#include "core/error.h"
#include "meshtrain_version.h"  // generated at build time (cmake/version.cmake)
#include "obs/run_info.h"

namespace {

// Under mpirun every process reads the same command line, so an error in it (bad input,
// exit 2) is the same on every rank: the first process of each host prints it (rank 0's
// host, and a host whose files differ), the others only exit with its code. Errors while
// running are every rank's own and keep their "[rank N]" prefix.
bool prints_input_errors() {
  return !mt::comm::started_by_mpirun() || mt::comm::mpi_env_local_rank() <= 0;
}

// A process that does not print an input error leaves the exit to the one that does: mpirun
// ends the whole job when the first process exits non-zero, and if that were a quiet one the
// printing process could be killed before its message reached the terminal (seen as a run
// that fails with no error at all). The wait is bounded in case the printing process hangs.
int exit_quietly(int code) {
  std::this_thread::sleep_for(std::chrono::seconds(10));
  return code;
}

std::string rank_prefix() {
  const int rank = mt::comm::mpi_env_world_rank();
  return rank > 0 ? "[rank " + std::to_string(rank) + "] " : "";
}

}  // namespace

int main(int argc, char** argv) {
  mt::obs::set_command_line(argc, argv);
  CLI::App app{"meshtrain: trains GPT-style transformers with composed parallelism"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("meshtrain ") + MESHTRAIN_VERSION + " (commit " +
                                        MESHTRAIN_COMMIT + ")");
  mt::cli::register_train(app);
  mt::cli::register_verify(app);
  mt::cli::register_eval(app);
  mt::cli::register_sample(app);
  mt::cli::register_report(app);
  mt::cli::register_prepare(app);
  mt::cli::register_plan(app);
  mt::cli::register_simulate(app);
  mt::cli::register_calibrate(app);
  mt::cli::register_schedule(app);
  mt::cli::register_checkpoint(app);
  mt::cli::register_launch(app);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks of meshtrain itself");
  bench->require_subcommand(1);
  mt::cli::register_bench_kernels(*bench);
  mt::cli::register_bench_comm(*bench);
  try {
    mt::cli::check_subcommand_words(app, std::vector<std::string>(argv + 1, argv + argc));
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (!prints_input_errors()) return exit_quietly(static_cast<int>(mt::ExitCode::kBadInput));
    app.exit(e);
    return static_cast<int>(mt::ExitCode::kBadInput);
  } catch (const mt::Error& e) {
    // A run stopped on request (a signal) says where it stopped, once (rank 0's process).
    if (e.code() == mt::ExitCode::kStopped) {
      if (*e.what()) std::fprintf(stderr, "%s\n", e.what());
    } else if (e.code() == mt::ExitCode::kBadInput && !prints_input_errors()) {
      return exit_quietly(e.exit_code());
    } else {
      std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), e.what());
    }
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), e.what());
    return static_cast<int>(mt::ExitCode::kRunFailure);
  }
  return 0;
}
