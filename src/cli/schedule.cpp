// `meshtrain schedule`: builds a pipeline schedule, verifies it, and prints its action lists
// as a grid (one column per rank), the unit-cost timeline and its bubble fraction.
#include "parallel/pipeline/schedule.h"

#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "parallel/pipeline/buffers.h"
#include "parallel/pipeline/replay.h"
#include "parallel/pipeline/verify.h"

namespace mt::cli {

namespace {

struct ScheduleFlags {
  int pp = 4;
  int microbatches = 8;
  int virtual_stages = 1;
  std::string schedule = "1f1b";
  bool comm = false;
  bool timeline = false;
  bool batched = false;
};

void run_schedule(const ScheduleFlags& f) {
  namespace pp = parallel::pp;
  const pp::ScheduleKind kind = pp::parse_schedule_kind(f.schedule);
  const pp::Schedule s =
      pp::build_schedule(kind, f.pp, f.microbatches, f.virtual_stages,
                         f.batched ? pp::Lowering::kBatched : pp::Lowering::kPerAction);
  pp::verify_or_throw(s);
  std::printf(
      "schedule %s: pp %d, microbatches %d, virtual stages %d (verified: complete, "
      "dependencies respected, deadlock-free%s)\n",
      pp::schedule_kind_name(kind), s.pp, s.microbatches, s.virtual_stages,
      f.batched ? ", also with blocking exchanges" : "");
  std::printf(
      "F = forward, B = backward, I = backward-input, W = backward-weight; "
      "F3.1 = microbatch 3, chunk 1%s\n\n",
      f.comm ? "; sa/ra send/receive activations, sg/rg gradients, >peer <peer" : "");
  std::fputs(pp::format_grid(s, f.comm).c_str(), stdout);
  // Unit costs per chunk: F = 1, B = 2 (I = W = 1 when split).
  // Batched exchanges are replayed as NCCL runs them (a send waits for its receive).
  const pp::Timeline t =
      f.batched ? pp::replay_rendezvous(s, pp::unit_costs()) : pp::replay(s, pp::unit_costs());
  if (f.timeline) {
    std::printf("\ntimeline with unit costs (F = 1, B = 2, I = W = 1; '.' idle):\n");
    std::fputs(pp::format_timeline(s, t).c_str(), stdout);
  }
  std::string peaks, buffers;
  for (int p : pp::peak_in_flight(s)) peaks += fmt::format(" {}", p);
  for (int b : pp::plan_buffers(s).buffers) buffers += fmt::format(" {}", b);
  std::printf(
      "\nunit-cost makespan %g, bubble fraction %.4f; peak microbatches in flight per "
      "rank:%s; activation buffers train allocates per rank (buffers.h):%s\n",
      t.makespan, t.bubble_fraction(), peaks.c_str(), buffers.c_str());
}

}  // namespace

void register_schedule(CLI::App& app) {
  auto f = std::make_shared<ScheduleFlags>();
  CLI::App* cmd = app.add_subcommand(
      "schedule", "print and verify a pipeline schedule (action lists per rank)");
  cmd->add_option("--pp", f->pp, "pipeline ranks")->capture_default_str();
  cmd->add_option("--microbatches", f->microbatches, "microbatches per step")
      ->capture_default_str();
  cmd->add_option("--schedule", f->schedule, "gpipe, 1f1b, interleaved or zb1")
      ->capture_default_str();
  cmd->add_option("--virtual-stages", f->virtual_stages, "chunks per rank (interleaved)")
      ->capture_default_str();
  cmd->add_flag("--comm", f->comm, "show the send/receive actions too");
  cmd->add_flag("--timeline", f->timeline, "print the unit-cost timeline (bubbles as '.')");
  cmd->add_flag("--batched", f->batched,
                "Megatron-LM's batched exchanges for blocking (NCCL) point-to-point, replayed "
                "with each send waiting for its receive");
  cmd->callback([f] { run_schedule(*f); });
}

}  // namespace mt::cli
