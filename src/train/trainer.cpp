#include "train/trainer.h"

#include <cmath>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"
#include "kernels/peak.h"
#include "model/gpt.h"
#include "obs/metrics.h"
#include "train/hf_export.h"
#include "train/token_file.h"

namespace mt::train {

void TrainOptions::validate() const {
  model.validate();
  if (batch < 1) fail("--batch {} must be at least 1", batch);
  if (microbatch < 0) fail("--microbatch {} must be at least 1", microbatch);
  if (batch % microbatch_size() != 0)
    fail("--microbatch {} does not divide --batch {} (choose a divisor of {})", microbatch_size(),
         batch, batch);
  if (steps < 1) fail("--steps {} must be at least 1", steps);
  if (!(lr > 0) || !std::isfinite(lr)) fail("--lr {} must be a positive number", lr);
  if (data.empty()) fail("no training data: pass --data FILE.bin (make one with `meshtrain prepare`)");
  if (val_fraction < 0 || val_fraction >= 1)
    fail("validation fraction {} must be in [0, 1)", val_fraction);
}

namespace {

struct Splits {
  std::unique_ptr<TokenFile> train_file, val_file;
  std::unique_ptr<SequenceSampler> train, val;
};

Splits make_splits(const TrainOptions& o) {
  const int64_t T = o.model.seq_len;
  Splits s;
  s.train_file = std::make_unique<TokenFile>(o.data, o.model.vocab);
  const int64_t total = (s.train_file->num_tokens() - 1) / T;
  if (!o.val_data.empty()) {
    s.val_file = std::make_unique<TokenFile>(o.val_data, o.model.vocab);
    s.train = std::make_unique<SequenceSampler>(*s.train_file, T, 0, total);
    s.val = std::make_unique<SequenceSampler>(*s.val_file, T, 0, (s.val_file->num_tokens() - 1) / T);
    return s;
  }
  // Hold out the last val_fraction of the sequences (at least one when there are two).
  int64_t held = static_cast<int64_t>(std::floor(total * o.val_fraction));
  if (o.val_fraction > 0 && held == 0 && total >= 2) held = 1;
  s.train = std::make_unique<SequenceSampler>(*s.train_file, T, 0, total - held);
  if (held > 0) s.val = std::make_unique<SequenceSampler>(*s.train_file, T, total - held, held);
  return s;
}

float evaluate(model::Gpt& gpt, model::Activations& acts, const SequenceSampler& val,
               int64_t batches, std::vector<int32_t>& in, std::vector<int32_t>& tgt) {
  double sum = 0;
  const int64_t B = acts.B;
  for (int64_t k = 0; k < batches; ++k) {
    val.fill(k * B, B, in.data(), tgt.data());
    sum += gpt.forward(acts, in.data(), tgt.data());
  }
  return static_cast<float>(sum / static_cast<double>(batches));
}

}  // namespace

TrainResult run_training(const TrainOptions& o) {
  o.validate();
  const int threads = o.threads > 0 ? o.threads : std::max(1, kernels::host_cores());
  kernels::set_threads(threads);
  profile::enable(o.profile);
  profile::reset();
  obs::Progress progress;
  obs::MetricsWriter metrics(o.metrics);

  Splits data = make_splits(o);
  model::Gpt gpt(o.model, o.seed);
  AdamW opt(gpt.params(), o.adamw);
  const int64_t T = o.model.seq_len, mb = o.microbatch_size(), n_micro = o.batch / mb;
  model::Activations acts = gpt.make_activations(mb, T);
  std::vector<int32_t> inputs(mb * T), targets(mb * T);
  const int64_t warmup = o.warmup >= 0 ? o.warmup : o.steps / 20;
  const double flops_per_token = model::training_flops_per_token(o.model, T);
  const double peak = o.peak_flops > 0 ? o.peak_flops : kernels::peak_flops(DType::kF32, threads);
  mem::Tracker& tracker = mem::current_tracker();

  if (!o.quiet)
    progress.line(fmt::format(
        "meshtrain: model {} ({} layers, d_model {}, {} heads, vocab {} padded to {}), {:.2f}M "
        "parameters; batch {} x seq {} in {} microbatch(es); {} thread(s); data {} ({} train "
        "sequences)",
        o.model.name, o.model.n_layer, o.model.d_model, o.model.n_head, o.model.vocab,
        o.model.padded_vocab(), gpt.params().numel() / 1e6, o.batch, T, n_micro, threads, o.data,
        data.train->num_samples()));

  TrainResult result;
  int64_t allocations_after_step1 = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    const double t0 = now_s();
    gpt.params().zero_grads();
    double loss_sum = 0;
    for (int64_t m = 0; m < n_micro; ++m) {
      data.train->fill(step * o.batch + m * mb, mb, inputs.data(), targets.data());
      loss_sum += gpt.forward(acts, inputs.data(), targets.data());
      gpt.backward(acts, 1.0f / static_cast<float>(o.batch * T));
    }
    const float loss = static_cast<float>(loss_sum / static_cast<double>(n_micro));
    if (!std::isfinite(loss))
      fail_run("loss is {} at step {} (lower --lr, raise --warmup, or check the data)", loss,
               step + 1);
    const double norm = clip_grad_norm(gpt.params(), o.grad_clip);
    const float lr = lr_at(step, warmup, o.steps, o.lr, o.min_lr_ratio);
    opt.step(lr);
    const double dt = now_s() - t0;
    if (step == 0) allocations_after_step1 = tracker.snapshot().allocations;

    StepRecord r;
    r.step = step + 1;
    r.loss = loss;
    r.lr = lr;
    r.grad_norm = norm;
    r.time_s = dt;
    r.tokens_per_s = static_cast<double>(o.batch * T) / dt;
    r.mfu = r.tokens_per_s * flops_per_token / peak;
    r.peak_bytes = tracker.snapshot().total_peak_bytes;
    result.steps.push_back(r);

    nlohmann::json row = {{"step", r.step},         {"loss", r.loss},
                          {"lr", r.lr},             {"grad_norm", r.grad_norm},
                          {"tokens_per_s", r.tokens_per_s}, {"mfu", r.mfu},
                          {"peak_bytes", r.peak_bytes},     {"time_s", r.time_s}};
    const bool eval_now = data.val && ((o.eval_every > 0 && r.step % o.eval_every == 0) ||
                                       r.step == o.steps);
    if (eval_now) {
      const int64_t batches = std::max<int64_t>(1, std::min(o.eval_batches, data.val->num_samples() / mb));
      const float vl = evaluate(gpt, acts, *data.val, batches, inputs, targets);
      result.val_losses.emplace_back(r.step, vl);
      row["val_loss"] = vl;
    }
    metrics.write(row);
    if (!o.quiet) {
      std::string text = fmt::format(
          "step {:>5}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s | MFU {:.1f}% | "
          "peak {} | {:.0f} ms",
          r.step, o.steps, r.loss, r.lr, r.grad_norm, r.tokens_per_s, 100 * r.mfu,
          obs::human_bytes(static_cast<double>(r.peak_bytes)), 1000 * dt);
      if (row.contains("val_loss")) text += fmt::format(" | val loss {:.4f}", row["val_loss"].get<float>());
      if (progress.is_terminal() && !row.contains("val_loss") && r.step % 10 != 0 && r.step != o.steps)
        progress.status(text);
      else
        progress.line(text);
    }
  }
  result.allocations_after_first_step = tracker.snapshot().allocations - allocations_after_step1;

  if (o.profile) {
    double total = 0;
    for (const auto& [name, e] : profile::entries()) total += e.time_s;
    progress.line(fmt::format("profile over {} steps (time in each kind of kernel):", o.steps));
    std::vector<std::pair<std::string, profile::Entry>> rows(profile::entries().begin(), profile::entries().end());
    std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.time_s > b.second.time_s; });
    for (const auto& [name, e] : rows)
      progress.line(fmt::format("  {:<20} {:>9.3f} s {:>6.1f}%  {:>7} calls", name, e.time_s,
                                100 * e.time_s / total, e.calls));
  }
  if (!o.export_path.empty()) {
    export_hf_safetensors(gpt, o.export_path);
    if (!o.quiet) progress.line(fmt::format("exported weights to {}", o.export_path));
  }
  if (o.keep_final_params) {
    const Tensor& v = gpt.params().flat_values();
    result.final_params.assign(v.f32(), v.f32() + v.numel());
  }
  return result;
}

}  // namespace mt::train
