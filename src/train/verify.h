// `meshtrain verify`: a layout against the single-rank oracle on the same config, seed and
// data — per-step loss and gradient norm, the largest parameter difference at the end, and
// a verdict against stated tolerances (docs/verify.md says where the defaults come from).
#pragma once

#include <string>
#include <vector>

#include "train/safetensors.h"
#include "train/trainer.h"

namespace mt::train {

// f32 tolerances. The defaults are 10-20x the worst difference measured on `tiny` + the
// demo text over 20 steps, across dp (ZeRO 0-3), tp (with and without sp), dp x tp and pp
// layouts (docs/verify.md has the table).
struct VerifyTolerances {
  double loss_rel = 2e-6;       // |Δ loss| / oracle loss, at any step (worst measured 1.4e-7)
  double grad_norm_rel = 1e-4;  // |Δ grad norm| / oracle grad norm, any step (worst 5.8e-6)
  double param_abs = 1e-4;      // largest |Δ| of any final parameter element (worst 1.0e-5)
  // --dtype bf16 (layout and oracle both): rounding GEMM inputs to 8 bits of mantissa makes
  // the layouts' f32 reordering visible sooner; Adam then moves a weight by up to ~lr per
  // step where a tiny gradient flips sign (docs/verify.md).
  static VerifyTolerances bf16() { return {1e-3, 5e-3, 2e-2}; }
};

struct StepComparison {
  int64_t step = 0;  // 1-based
  float oracle_loss = 0, layout_loss = 0;
  double oracle_grad_norm = 0, layout_grad_norm = 0;
  double loss_abs_diff() const;
  double loss_rel_diff() const;
  double grad_norm_rel_diff() const;
};

struct ParamComparison {
  bool compared = false;  // false where the layout cannot export its weights yet
  std::string abs_name;   // the tensor holding the largest element difference
  double abs_diff = 0;    // max |layout - oracle| over all elements
  std::string rel_name;   // the tensor with the largest relative difference
  double rel_diff = 0;    // ||layout - oracle|| / ||oracle|| of that tensor (information only)
};

struct VerifyReport {
  std::vector<StepComparison> steps;
  ParamComparison params;
  VerifyTolerances tol;
  bool lead = true;  // false on mpirun's ranks other than 0: they ran the layout only
  double worst_loss_rel() const;
  double worst_grad_norm_rel() const;
  bool pass() const;
};

// The oracle of a layout: one rank (dp = tp = pp = 1, ZeRO 0, no sp) on the same global
// batch, with the layout's per-forward microbatch size, so every forward sees the same
// sequences as one of the layout's forwards and the sample order is identical.
TrainOptions oracle_options(const TrainOptions& layout);
// "dp 2 (ZeRO-1) x tp 2 (sp)", "pp 2 (1f1b, 4 microbatches)", "1 rank".
std::string describe_layout(const TrainOptions& o);

std::vector<StepComparison> compare_steps(const TrainResult& oracle, const TrainResult& layout);
ParamComparison compare_params(const SafetensorsFile& oracle, const SafetensorsFile& layout);

// Runs the layout, then the oracle (normally oracle_options(layout)), both on the local
// backend (under mpirun: the layout as the job's processes, then the oracle on rank 0 alone;
// the other ranks return a report with lead = false), quiet, their weights exported to a temporary
// folder removed afterwards, and compares them. Bad input throws (exit 2) before any work; a failed
// run throws as run_training does.
VerifyReport run_verify(const TrainOptions& layout, const TrainOptions& oracle,
                        const VerifyTolerances& tol);

}  // namespace mt::train
