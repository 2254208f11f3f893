// Each subcommand of `meshtrain` lives in its own file and registers itself here.
#pragma once

#include <CLI/CLI.hpp>

namespace mt::cli {

void register_train(CLI::App& app);
void register_verify(CLI::App& app);  // verify.cpp: a layout against the single-rank oracle
void register_eval(CLI::App& app);
void register_sample(CLI::App& app);  // sample.cpp: text from exported weights
void register_report(CLI::App& app);  // report.cpp: one HTML page of runs
void register_prepare(CLI::App& app);
void register_plan(CLI::App& app);        // plan.cpp
void register_simulate(CLI::App& app);    // simulate.cpp
void register_calibrate(CLI::App& app);   // calibrate.cpp
void register_schedule(CLI::App& app);    // pipeline schedules: print and verify
void register_checkpoint(CLI::App& app);  // checkpoint.cpp: inspect, reshard, export
void register_launch(CLI::App& app);      // launch.cpp: an elastic mpirun job over a hostfile
// `meshtrain bench NAME`: each benchmark of meshtrain itself prints a table, or with
// --json one JSON document.
void register_bench_kernels(CLI::App& bench);  // gemm, peak
void register_bench_comm(CLI::App& bench);     // comm

}  // namespace mt::cli
