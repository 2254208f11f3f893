#include "train/verify.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <string_view>
#include <utility>

#include "comm/mpi.h"
#include "core/error.h"
#include "model/gpt.h"
#include "model/routing_tape.h"
#include "train/hf_export.h"

namespace mt::train {

namespace {

double rel(double diff, double ref) { return ref != 0 ? diff / std::abs(ref) : diff; }

// A folder of its own under the system temporary folder, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("meshtrain-verify-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Under mpirun the layout runs as the job's processes (one rank each, possibly on several
// hosts) and rank 0 alone then runs the oracle as one rank thread; outside mpirun both run as
// threads of this process.
int mpirun_world_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* s = std::getenv(var); s && std::atoi(s) > 1) {
      for (const char* rv : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"})
        if (const char* r = std::getenv(rv)) return std::atoi(r);
      return 0;
    }
  return -1;  // not under mpirun (or a job of one process)
}

// What verify needs of either run: one process, no output of its own, no peak measurement
// (MFU is not compared).
TrainOptions quiet_local(TrainOptions o, bool local = true) {
  if (local) o.backend = "local";
  o.quiet = true;
  o.metrics.clear();
  o.profile = false;
  o.pipeline.trace.clear();
  o.keep_final_params = false;
  if (o.peak_flops <= 0) o.peak_flops = 1e12;
  o.validate();
  return o;
}

}  // namespace

double StepComparison::loss_abs_diff() const {
  return std::abs(static_cast<double>(layout_loss) - oracle_loss);
}
double StepComparison::loss_rel_diff() const { return rel(loss_abs_diff(), oracle_loss); }
double StepComparison::grad_norm_rel_diff() const {
  return rel(std::abs(layout_grad_norm - oracle_grad_norm), oracle_grad_norm);
}

double VerifyReport::worst_loss_rel() const {
  double m = 0;
  for (const auto& s : steps) m = std::max(m, s.loss_rel_diff());
  return m;
}

double VerifyReport::worst_grad_norm_rel() const {
  double m = 0;
  for (const auto& s : steps) m = std::max(m, s.grad_norm_rel_diff());
  return m;
}

bool VerifyReport::pass() const {
  // Written so that a NaN difference fails.
  return worst_loss_rel() <= tol.loss_rel && worst_grad_norm_rel() <= tol.grad_norm_rel &&
         (!params.compared || params.abs_diff <= tol.param_abs) &&
         (!params.update_compared || params.update_rel <= tol.update_rel);
}

TrainOptions oracle_options(const TrainOptions& layout) {
  TrainOptions o = layout;
  o.dp = 1;
  o.tp = 1;
  o.sp = false;
  o.cp = 1;
  o.ep = 1;
  o.moe.shadow = false;  // a way of running ep, not of the model
  o.zero = 0;
  o.pipeline = PipelineOptions{};
  o.microbatch = layout.microbatch_size();  // each forward sees the same sequences
  o.device = "cpu";                         // the oracle: one CPU rank
  o.attention = "naive";                    // the T x T kernel: the plainest arithmetic
  return o;
}

std::string describe_layout(const TrainOptions& o) {
  std::vector<std::string> parts;
  if (o.pipeline.pp > 1) {
    const int m = o.microbatch_count();
    parts.push_back(
        fmt::format("pp {} ({}, {} microbatches)", o.pipeline.pp, o.pipeline.schedule, m));
  }
  if (o.dp > 1)
    parts.push_back(fmt::format(
        "dp {} (ZeRO-{}{})", o.dp, o.zero,
        o.ep > 1 ? fmt::format(", experts over ep {}{}", o.ep, o.moe.shadow ? " with shadows" : "")
                 : ""));
  if (o.cp > 1) parts.push_back(fmt::format("cp {} ({})", o.cp, o.cp_comm));
  if (o.tp > 1) parts.push_back(fmt::format("tp {}{}", o.tp, o.sp ? " (sp)" : ""));
  std::string s = parts.empty() ? "1 rank" : parts[0];
  for (size_t i = 1; i < parts.size(); ++i) s += " x " + parts[i];
  if (o.device != "cpu")
    s += " on " + o.device + (o.fused_attention() ? " (fused attention)" : " (naive attention)");
  return s;
}

std::vector<StepComparison> compare_steps(const TrainResult& oracle, const TrainResult& layout) {
  MT_ASSERT(oracle.steps.size() == layout.steps.size());
  std::vector<StepComparison> out;
  for (size_t i = 0; i < oracle.steps.size(); ++i) {
    const StepRecord &a = oracle.steps[i], &b = layout.steps[i];
    out.push_back({a.step, a.loss, b.loss, a.grad_norm, b.grad_norm});
  }
  return out;
}

namespace {
// sqrt(diff_sq / ref_sq): a ratio of two norms (a NaN stays a NaN; a difference over a zero
// reference is infinite).
double norm_ratio(double diff_sq, double ref_sq) {
  if (ref_sq > 0) return std::sqrt(diff_sq / ref_sq);
  return diff_sq > 0 ? std::numeric_limits<double>::infinity() : std::sqrt(diff_sq);
}
// Keeps the worst (name, value): `!(x <= best)` so that a NaN is the one reported.
void keep_worst(std::string& name, double& best, const std::string& n, double x) {
  if (name.empty() || !(x <= best)) {
    name = n;
    best = x;
  }
}
// The elements of `name` whose true gradient is zero, as [begin, end): the key part of
// GPT-2's fused qkv bias (a key bias adds q·b to every score of a query's row, and softmax
// is invariant to a per-row constant). What such an element receives is rounding noise,
// which AdamW scales to updates of ~lr: its "update" is noise in both runs, and comparing
// two noises says nothing about the layout (docs/verify.md, "The update check").
std::pair<size_t, size_t> gradient_free_elements(const std::string& name, size_t size) {
  const std::string key_bias = "attn.c_attn.bias";
  if (name.size() >= key_bias.size() &&
      name.compare(name.size() - key_bias.size(), key_bias.size(), key_bias) == 0 && size % 3 == 0)
    return {size / 3, 2 * size / 3};
  return {0, 0};
}
}  // namespace

ParamComparison compare_params(const SafetensorsFile& oracle, const SafetensorsFile& layout,
                               const SafetensorsFile* init) {
  ParamComparison c;
  c.compared = true;
  c.update_compared = init != nullptr;
  for (const auto& [name, a] : oracle.arrays) {
    const auto it = layout.arrays.find(name);
    if (it == layout.arrays.end() || it->second.data.size() != a.data.size())
      fail_run("the layout's exported weights lack '{}' or differ in its shape", name);
    const std::vector<float>& b = it->second.data;
    const std::vector<float>* w0 = nullptr;
    if (init) {
      const auto i0 = init->arrays.find(name);
      if (i0 == init->arrays.end() || i0->second.data.size() != a.data.size())
        fail_run("the initial weights lack '{}' or differ in its shape", name);
      w0 = &i0->second.data;
    }
    double diff = 0, diff_sq = 0, ref_sq = 0, update_sq = 0, update_diff_sq = 0;
    const auto [free_begin, free_end] = gradient_free_elements(name, a.data.size());
    for (size_t i = 0; i < a.data.size(); ++i) {
      const double d = static_cast<double>(b[i]) - a.data[i];
      diff = std::max(diff, std::abs(d));
      diff_sq += d * d;
      ref_sq += static_cast<double>(a.data[i]) * a.data[i];
      if (w0 && !(i >= free_begin && i < free_end)) {
        const double u = static_cast<double>(a.data[i]) - (*w0)[i];  // the oracle's update
        update_sq += u * u;
        update_diff_sq += d * d;
      }
    }
    if (std::isnan(diff_sq)) update_diff_sq = diff_sq;
    if (std::isnan(diff_sq)) diff = diff_sq;  // std::max drops NaN; a NaN must fail
    keep_worst(c.abs_name, c.abs_diff, name, diff);
    keep_worst(c.rel_name, c.rel_diff, name, norm_ratio(diff_sq, ref_sq));
    // Δ_layout - Δ_oracle = layout - oracle: the same difference, over the update's size.
    // (without the gradient-free elements, whose update is noise in both runs)
    if (w0) keep_worst(c.update_name, c.update_rel, name, norm_ratio(update_diff_sq, update_sq));
  }
  if (layout.arrays.size() != oracle.arrays.size())
    fail_run("the layout exported {} tensors, the oracle {}", layout.arrays.size(),
             oracle.arrays.size());
  return c;
}

bool export_initial_weights(const TrainOptions& o, const std::string& path) {
  // --init-from: the file's names and layout are Hugging Face's, not always the export's.
  if (!o.init_from.empty()) return false;
  const model::Gpt gpt(o.model, o.seed);  // one rank: the global initialisation of the seed
  export_hf_safetensors(gpt, path);
  return true;
}

VerifyReport run_verify(const TrainOptions& layout_options, const TrainOptions& oracle_opts,
                        const VerifyTolerances& tol) {
  const int mpi_rank = mpirun_world_rank();
  if (mpi_rank < 0 && layout_options.backend == "mpi")
    fail(
        "--backend mpi: verify runs the layout and the oracle as threads of one process outside "
        "mpirun (drop --backend, or start the layout under mpirun: `mpirun -np N meshtrain "
        "verify ...`)");
  const TrainOptions layout = quiet_local(layout_options, /*local=*/mpi_rank < 0);
  const TrainOptions oracle = quiet_local(oracle_opts);

  TempDir dir;
  const std::string layout_path = (dir.path / "layout.safetensors").string();
  const std::string oracle_path = (dir.path / "oracle.safetensors").string();
  VerifyReport report;
  report.tol = tol;
  // The layout first: its refusals come before any work. A layout that cannot export (tp or
  // pp on a GPU) runs without it and only its losses and gradient norms are compared
  // (params.compared stays false), rather than the whole verify being refused.
  const bool layout_exports = layout.export_supported();
  TrainOptions layout_exporting = layout;
  if (layout_exports) layout_exporting.export_path = layout_path;
  // MoE: the oracle replays the layout's routing, so that both train the same model (a
  // routing choice flips on the last bit of a router probability; model/routing_tape.h).
  // Under mpirun each process records its own microbatches and rank 0 gathers them.
  auto tape = std::make_shared<model::RoutingTape>();
  // (cp: each cp rank records its rows of every sequence, and the tape merges the pieces.)
  const bool replay = layout.model.moe.enabled();
  if (replay) {
    layout_exporting.routing_tape = tape;
    layout_exporting.record_routing = true;
  }
  const TrainResult b = run_training(layout_exporting);
  if (replay && mpi_rank >= 0) {
    const std::vector<int32_t> all = comm::gather_to_world_root(tape->serialize());
    if (mpi_rank == 0) {
      tape = std::make_shared<model::RoutingTape>();
      tape->merge(all);
    }
  }
  if (mpi_rank > 0) {  // (rank 0 wrote the export, and compares)
    report.lead = false;
    return report;
  }
  TrainOptions oracle_exporting = oracle;
  if (layout_exports) oracle_exporting.export_path = oracle_path;
  if (replay) {
    oracle_exporting.routing_tape = tape;
    oracle_exporting.record_routing = false;
    report.routing_records = tape->size();
  }
  const TrainResult a = run_training(oracle_exporting);
  report.steps = compare_steps(a, b);
  if (layout_exports) {
    const std::string init_path = (dir.path / "init.safetensors").string();
    if (export_initial_weights(oracle, init_path)) {
      const SafetensorsFile init = read_safetensors(init_path);
      report.params =
          compare_params(read_safetensors(oracle_path), read_safetensors(layout_path), &init);
    } else {
      report.params = compare_params(read_safetensors(oracle_path), read_safetensors(layout_path));
    }
  }
  return report;
}

}  // namespace mt::train
