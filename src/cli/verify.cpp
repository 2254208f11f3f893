// `meshtrain verify`: runs a layout and the single-rank oracle on the same config, seed and
// data for K steps, prints a per-step comparison and the largest parameter difference, and
// says PASS (exit 0) or FAIL (exit 1) against the tolerances (docs/verify.md).
#include "train/verify.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/train_flags.h"
#include "core/error.h"

namespace mt::cli {

namespace {

struct VerifyFlags {
  TrainFlags run;
  train::VerifyTolerances tol;
  bool json = false;
  int64_t layout_seed = -1;  // testing only (hidden): the layout trains from another seed
  bool loss_given = false, norm_given = false, param_given = false, update_given = false;
};

// bf16 with --init-from: the absolute parameter bound of before the update check (docs/verify.md).
constexpr double kParamAbsBf16InitFrom = 2e-2;

void check_tolerance(const char* flag, double v) {
  if (!(v >= 0) || !std::isfinite(v))
    fail("{} {} must be a finite number >= 0 (0 asks for bitwise equality)", flag, v);
}

std::string failures(const train::VerifyReport& r) {
  std::string why;
  auto add = [&](const char* what, double got, double tol) {
    if (got <= tol) return;  // (a NaN is reported)
    why += fmt::format("{}{} differs by {:.3g} relative (tolerance {:.3g})",
                       why.empty() ? "" : "; ", what, got, tol);
  };
  add("loss", r.worst_loss_rel(), r.tol.loss_rel);
  add("grad norm", r.worst_grad_norm_rel(), r.tol.grad_norm_rel);
  if (r.params.compared && !(r.params.abs_diff <= r.tol.param_abs))
    why += fmt::format("{}{} differs by {:.3g} (tolerance {:.3g})", why.empty() ? "" : "; ",
                       r.params.abs_name, r.params.abs_diff, r.tol.param_abs);
  if (r.params.update_compared && !(r.params.update_rel <= r.tol.update_rel))
    why += fmt::format("{}{}'s update differs by {:.3g} of its size (tolerance {:.3g})",
                       why.empty() ? "" : "; ", r.params.update_name, r.params.update_rel,
                       r.tol.update_rel);
  return why;
}

void print_table(std::FILE* out, const train::TrainOptions& layout,
                 const train::TrainOptions& oracle, const train::VerifyReport& r) {
  fmt::print(out,
             "verify: {} against the oracle (1 rank, microbatch {}); model {}, batch {}, seed {}, "
             "{} steps\n",
             train::describe_layout(layout), oracle.microbatch, layout.model.name, layout.batch,
             layout.seed, layout.steps);
  fmt::print(out, "{:>5} | {:>11} | {:>11} | {:>9} | {:>9} | {:>11} | {:>11} | {:>9}\n", "step",
             "oracle loss", "layout loss", "|Δ|", "rel Δ", "oracle norm", "layout norm", "rel Δ");
  for (const auto& s : r.steps)
    fmt::print(
        out,
        "{:>5} | {:>11.7f} | {:>11.7f} | {:>9.2e} | {:>9.2e} | {:>11.7f} | {:>11.7f} | {:>9.2e}\n",
        s.step, s.oracle_loss, s.layout_loss, s.loss_abs_diff(), s.loss_rel_diff(),
        s.oracle_grad_norm, s.layout_grad_norm, s.grad_norm_rel_diff());
  if (r.params.compared)
    fmt::print(out,
               "largest parameter difference: absolute {:.2e} ({}); relative {:.2e} ({}; ||Δ|| / "
               "||oracle|| of the tensor)\n",
               r.params.abs_diff, r.params.abs_name, r.params.rel_diff, r.params.rel_name);
  else
    fmt::print(out, "parameters not compared: this layout cannot export its weights yet\n");
  if (r.params.update_compared)
    fmt::print(out,
               "largest update difference: {:.2e} ({}; ||Δ_layout - Δ_oracle|| / ||Δ_oracle|| of "
               "the tensor's change over the run; tolerance {:.2g})\n",
               r.params.update_rel, r.params.update_name, r.tol.update_rel);
  else if (r.params.compared)
    fmt::print(out, "updates not compared: the initial weights come from --init-from\n");
  if (r.routing_records > 0)
    fmt::print(out,
               "routing: the oracle replayed the layout's routing decisions ({} microbatch x "
               "MoE layer records), so both trained the same model\n",
               r.routing_records);
  fmt::print(out,
             "worst: loss {:.2e} relative (tolerance {:.0e}), grad norm {:.2e} relative ({:.0e}), "
             "parameters {} absolute ({})\n",
             r.worst_loss_rel(), r.tol.loss_rel, r.worst_grad_norm_rel(), r.tol.grad_norm_rel,
             r.params.compared ? fmt::format("{:.2e}", r.params.abs_diff) : "-",
             std::isfinite(r.tol.param_abs) ? fmt::format("{:.0e}", r.tol.param_abs) : "off");
  fmt::print(out, "{}\n", r.pass() ? "PASS" : "FAIL: " + failures(r));
}

nlohmann::json to_json(const train::TrainOptions& layout, const train::VerifyReport& r) {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : r.steps)
    steps.push_back({{"step", s.step},
                     {"oracle_loss", s.oracle_loss},
                     {"layout_loss", s.layout_loss},
                     {"loss_abs_diff", s.loss_abs_diff()},
                     {"loss_rel_diff", s.loss_rel_diff()},
                     {"oracle_grad_norm", s.oracle_grad_norm},
                     {"layout_grad_norm", s.layout_grad_norm},
                     {"grad_norm_rel_diff", s.grad_norm_rel_diff()}});
  nlohmann::json params = nullptr;
  if (r.params.compared)
    params = {{"abs_diff", r.params.abs_diff},
              {"abs_name", r.params.abs_name},
              {"rel_diff", r.params.rel_diff},
              {"rel_name", r.params.rel_name}};
  if (r.params.update_compared) {
    params["update_rel_diff"] = r.params.update_rel;
    params["update_name"] = r.params.update_name;
  }
  return {{"layout", train::describe_layout(layout)},
          {"dp", layout.dp},
          {"tp", layout.tp},
          {"cp", layout.cp},
          {"ep", layout.ep},
          {"pp", layout.pipeline.pp},
          {"zero", layout.zero},
          {"sp", layout.sp},
          {"steps", steps},
          {"params", params},
          {"worst_loss_rel_diff", r.worst_loss_rel()},
          {"worst_grad_norm_rel_diff", r.worst_grad_norm_rel()},
          {"tolerances",
           {{"loss_rel", r.tol.loss_rel},
            {"grad_norm_rel", r.tol.grad_norm_rel},
            {"param_abs", r.tol.param_abs},
            {"update_rel", r.tol.update_rel}}},
          {"pass", r.pass()}};
}

void run(const VerifyFlags& f) {
  check_tolerance("--tol-loss", f.tol.loss_rel);
  check_tolerance("--tol-norm", f.tol.grad_norm_rel);
  check_tolerance("--tol-param", f.tol.param_abs);
  check_tolerance("--tol-update", f.tol.update_rel);
  train::TrainOptions layout;
  layout.steps = 20;  // verify's default (a flag or the config file wins)
  // A train config serves as is: its outputs and checkpoint fields are not verify's.
  f.run.apply_to(layout, f.run.config_json(train_command_config_keys()));
  if (layout.outer.on())
    fail(
        "verify compares a layout against synchronous single-rank training, which --sites {} "
        "(DiLoCo) does not equal by design: verify the layout inside a site without --sites "
        "(docs/diloco.md says what DiLoCo's own tests check)",
        layout.outer.sites);
  const train::TrainOptions oracle = train::oracle_options(layout);
  train::VerifyTolerances tol = f.tol;
  if (layout.dtype == "bf16") {  // bf16 defaults, unless given (docs/verify.md)
    const train::VerifyTolerances bf16 = train::VerifyTolerances::bf16();
    if (!f.loss_given) tol.loss_rel = bf16.loss_rel;
    if (!f.norm_given) tol.grad_norm_rel = bf16.grad_norm_rel;
    // With --init-from there is no update check (the initial weights are not compared): the
    // former absolute bound then stands in, which cannot catch a missing update.
    if (!f.param_given)
      tol.param_abs = layout.init_from.empty() ? bf16.param_abs : kParamAbsBf16InitFrom;
    if (!f.update_given) tol.update_rel = bf16.update_rel;
  }
  // MoE in f32: the grad-norm bound of gradient spikes (VerifyTolerances::kGradNormRelMoe).
  if (layout.dtype != "bf16" && layout.model.moe.enabled() && !f.norm_given)
    tol.grad_norm_rel = train::VerifyTolerances::kGradNormRelMoe;
  if (f.layout_seed >= 0) layout.seed = static_cast<uint64_t>(f.layout_seed);
  const train::VerifyReport r = train::run_verify(layout, oracle, tol);
  if (!r.lead) return;  // under mpirun, rank 0 compares and reports
  // Human output goes to stderr when stdout carries the JSON.
  print_table(f.json ? stderr : stdout, layout, oracle, r);
  if (f.json) std::printf("%s\n", to_json(layout, r).dump(2).c_str());
  std::fflush(stdout);
  if (!r.pass())
    fail_run("the layout differs from the oracle beyond the tolerances: {}", failures(r));
}

}  // namespace

void register_verify(CLI::App& app) {
  auto f = std::make_shared<VerifyFlags>();
  CLI::App* cmd = app.add_subcommand(
      "verify",
      fmt::format(
          "run a layout and the single-rank oracle on the same config, seed and data; compare "
          "loss and grad norm step by step and the final parameters and their updates; PASS "
          "(exit 0) or FAIL (exit 1); --steps defaults to 20. Default tolerances (f32): 10-20x "
          "the worst difference measured on `tiny` over 20 steps across dp/ZeRO/tp/sp/pp "
          "layouts; with --dtype bf16 (the oracle in bf16 too): loss {:.0e}, norm {:.0e}, "
          "updates {:.2g} of their size, no absolute parameter bound; mixture-of-experts "
          "models in f32: norm {:.0e} (gradient spikes; docs/verify.md)",
          train::VerifyTolerances::kLossRelBf16, train::VerifyTolerances::kGradNormRelBf16,
          train::VerifyTolerances::kUpdateRelBf16, train::VerifyTolerances::kGradNormRelMoe));
  f->run.add_to(*cmd);
  cmd->add_option("--tol-loss", f->tol.loss_rel,
                  "largest relative loss difference at any step (worst measured: 1.0e-6)")
      ->capture_default_str();
  cmd->add_option("--tol-norm", f->tol.grad_norm_rel,
                  "largest relative grad-norm difference at any step (worst measured: 1.3e-5)")
      ->capture_default_str();
  cmd->add_option("--tol-param", f->tol.param_abs,
                  "largest absolute difference of any final parameter (worst measured: 1.0e-5)")
      ->capture_default_str();
  cmd->add_option("--tol-update", f->tol.update_rel,
                  "largest ||layout - oracle|| / ||oracle's change over the run|| of any tensor "
                  "(a tensor never updated scores 1)")
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "print the comparison as one JSON document on stdout");
  // Testing only: makes the layout train from another seed, so a test can see verify fail
  // for a real divergence. Not listed in --help.
  cmd->add_option("--layout-seed", f->layout_seed)->group("");
  cmd->callback([f, cmd] {
    f->loss_given = cmd->count("--tol-loss") > 0;
    f->norm_given = cmd->count("--tol-norm") > 0;
    f->param_given = cmd->count("--tol-param") > 0;
    f->update_given = cmd->count("--tol-update") > 0;
    run(*f);
  });
}

}  // namespace mt::cli
