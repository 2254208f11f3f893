#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"meshtrain: trains GPT-style transformers with composed parallelism"};
  app.require_subcommand(1);
  mt::cli::register_train(app);
  mt::cli::register_verify(app);
  mt::cli::register_eval(app);
  mt::cli::register_prepare(app);
  mt::cli::register_plan(app);
  mt::cli::register_simulate(app);
  mt::cli::register_calibrate(app);
  mt::cli::register_schedule(app);
  mt::cli::register_checkpoint(app);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks of meshtrain itself");
  bench->require_subcommand(1);
  mt::cli::register_bench_kernels(*bench);
  mt::cli::register_bench_comm(*bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return static_cast<int>(mt::ExitCode::kBadInput);
  } catch (const mt::Error& e) {
    // A run stopped on request (a signal) says where it stopped, once (rank 0's process).
    if (e.code() != mt::ExitCode::kStopped)
      std::fprintf(stderr, "error: %s\n", e.what());
    else if (*e.what())
      std::fprintf(stderr, "%s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return static_cast<int>(mt::ExitCode::kRunFailure);
  }
  return 0;
}
