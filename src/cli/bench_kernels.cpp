// `meshtrain bench gemm` and `meshtrain bench peak`: GEMM rates of this host through the
// kernels' own gemm (oneDNN), the numbers MFU is measured against.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/clock.h"
#include "core/error.h"
#include "kernels/flash_attention.h"
#include "kernels/kernels.h"
#include "kernels/peak.h"

namespace mt::cli {
namespace {

struct GemmFlags {
  int threads = 0;  // 0: all host cores
  bool json = false;
  std::string dtype = "all";
  int reps = 3;
};

struct GemmCase {
  const char* name;  // what the GEMM is in a GPT-2 124M step (N tokens = 1024, C = 768)
  bool ta, tb;
  int64_t m, n, k;
};

// x w^T forward (NT), dx = dy w (NN), dw = dy^T x (TN), for the 124M model's linears.
const GemmCase kCases[] = {
    {"square", false, false, 1024, 1024, 1024},     {"square", false, false, 2048, 2048, 2048},
    {"attn.qkv fwd", false, true, 1024, 2304, 768}, {"attn.proj fwd", false, true, 1024, 768, 768},
    {"mlp.fc fwd", false, true, 1024, 3072, 768},   {"mlp.proj fwd", false, true, 1024, 768, 3072},
    {"lm_head fwd", false, true, 1024, 50304, 768}, {"mlp.fc dx", false, false, 1024, 768, 3072},
    {"mlp.fc dw", true, false, 3072, 768, 1024},    {"lm_head dx", false, false, 1024, 768, 50304},
    {"lm_head dw", true, false, 50304, 768, 1024},
};

int resolve_threads(int t) { return t > 0 ? t : kernels::host_cores(); }

std::vector<DType> dtypes_of(const std::string& s) {
  if (s == "all") return {DType::kF32, DType::kBF16};
  if (s == "f32") return {DType::kF32};
  if (s == "bf16") return {DType::kBF16};
  fail("--dtype {} is not one of f32, bf16, all", s);
}

void run_gemm(const GemmFlags& f) {
  const int threads = resolve_threads(f.threads);
  const int saved = kernels::threads();
  kernels::set_threads(threads);
  std::FILE* human = f.json ? stderr : stdout;
  nlohmann::json rows = nlohmann::json::array();
  fmt::print(human, "{:<14} {:>3} {:>5} {:>6} {:>6} {:>6} {:>4} {:>10} {:>9}\n", "gemm", "op",
             "dtype", "m", "n", "k", "thr", "time_ms", "GFLOP/s");
  for (DType dt : dtypes_of(f.dtype)) {
    for (const auto& c : kCases) {
      double t = 0;
      const double flops = kernels::time_gemm_flops(dt, c.ta, c.tb, c.m, c.n, c.k, f.reps, &t);
      const std::string op = fmt::format("{}{}", c.ta ? 'T' : 'N', c.tb ? 'T' : 'N');
      fmt::print(human, "{:<14} {:>3} {:>5} {:>6} {:>6} {:>6} {:>4} {:>10.3f} {:>9.1f}\n", c.name,
                 op, dtype_name(dt), c.m, c.n, c.k, threads, t * 1e3, flops / 1e9);
      std::fflush(human);
      rows.push_back({{"op", "gemm_" + op},
                      {"case", c.name},
                      {"dtype", std::string(dtype_name(dt))},
                      {"m", c.m},
                      {"n", c.n},
                      {"k", c.k},
                      {"threads", threads},
                      {"time_s", t},
                      {"gflops", flops / 1e9}});
    }
  }
  kernels::set_threads(saved);
  if (f.json) std::printf("%s\n", rows.dump(2).c_str());
}

void run_peak(const GemmFlags& f) {
  const int threads = resolve_threads(f.threads);
  std::FILE* human = f.json ? stderr : stdout;
  nlohmann::json rows = nlohmann::json::array();
  for (DType dt : dtypes_of(f.dtype)) {
    const double flops = kernels::measure_peak_flops(dt, threads);
    const double kept = kernels::store_peak_flops(dt, threads, flops);
    fmt::print(human, "peak {:>4} on {} thread(s): measured {:.1f} GFLOP/s, cached {:.1f}\n",
               dtype_name(dt), threads, flops / 1e9, kept / 1e9);
    rows.push_back({{"op", "gemm_peak"},
                    {"dtype", std::string(dtype_name(dt))},
                    {"threads", threads},
                    {"gflops", flops / 1e9},
                    {"cached_gflops", kept / 1e9}});
  }
  fmt::print(human, "cached in {}\n", kernels::peak_cache_path());
  if (f.json) std::printf("%s\n", rows.dump(2).c_str());
}

// Best-of-reps time of fn (after one warm-up run).
template <class F>
double best_time(int reps, F&& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    fn();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

// The non-GEMM kernels at GPT-2 124M shapes: where a step's time goes besides GEMM.
void run_ops(const GemmFlags& f) {
  const int threads = resolve_threads(f.threads);
  const int saved = kernels::threads();
  kernels::set_threads(threads);
  std::FILE* human = f.json ? stderr : stdout;
  nlohmann::json rows = nlohmann::json::array();
  fmt::print(human, "{:<22} {:<26} {:>4} {:>10}\n", "op", "shape", "thr", "time_ms");
  auto row = [&](const std::string& op, const std::string& shape, double t) {
    fmt::print(human, "{:<22} {:<26} {:>4} {:>10.3f}\n", op, shape, threads, t * 1e3);
    std::fflush(human);
    rows.push_back({{"op", op}, {"shape", shape}, {"threads", threads}, {"time_s", t}});
  };
  // GPT-2 124M's attention, then Model S's widths at long sequences: the naive kernel
  // against the blockwise one (kernels/flash_attention.h).
  struct AttnShape {
    int64_t B, T, C, NH;
  };
  for (const AttnShape& a : {AttnShape{4, 256, 768, 12}, AttnShape{8, 256, 768, 12},
                             AttnShape{1, 2048, 256, 4}, AttnShape{1, 8192, 256, 4}}) {
    const int64_t B = a.B, T = a.T, C = a.C, NH = a.NH;
    std::vector<float> qkv(B * T * 3 * C, 0.1f), out(B * T * C), lse(B * NH * T), dqkv(qkv.size()),
        dout(out.size(), 0.01f);
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i % 13) * 0.05f - 0.3f;
    const std::string shape = fmt::format("B{} T{} C{} NH{}", B, T, C, NH);
    if (T <= 2048) {  // the naive kernel's T x T buffers: 1 GiB each at T = 8192
      std::vector<float> att(B * NH * T * T), scratch(att.size());
      row("attention_forward", shape, best_time(f.reps, [&] {
            kernels::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
          }));
      row("attention_backward", shape, best_time(f.reps, [&] {
            kernels::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(),
                                        att.data(), B, T, C, NH);
          }));
    }
    row("flash_attention_fwd", shape, best_time(f.reps, [&] {
          kernels::flash_attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
        }));
    row("flash_attention_bwd", shape, best_time(f.reps, [&] {
          kernels::flash_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                            lse.data(), B, T, C, NH);
        }));
  }
  {
    const int64_t n = 1024, V = 50257, Vp = 50304;
    std::vector<float> logits(n * Vp), losses(n), lse(n), d(logits.size());
    std::vector<int32_t> tg(n);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 101) * 0.03f;
    for (int64_t i = 0; i < n; ++i) tg[i] = static_cast<int32_t>((i * 7919) % V);
    const std::string shape = fmt::format("n{} V{} Vp{}", n, V, Vp);
    row("cross_entropy_forward", shape, best_time(f.reps, [&] {
          kernels::cross_entropy_forward(losses.data(), lse.data(), logits.data(), tg.data(), n, V,
                                         Vp);
        }));
    row("cross_entropy_backward", shape, best_time(f.reps, [&] {
          kernels::cross_entropy_backward(d.data(), logits.data(), lse.data(), tg.data(), 1.0f, n,
                                          V, Vp);
        }));
  }
  {
    const int64_t n = 1024, c = 768;
    std::vector<float> x(n * c, 0.5f), y(n * c), w(c, 1.0f), b(c), mean(n), rstd(n), dx(n * c),
        dw(c), db(c);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.1f;
    const std::string shape = fmt::format("n{} c{}", n, c);
    row("layernorm_forward", shape, best_time(f.reps, [&] {
          kernels::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                     b.data(), n, c);
        }));
    row("layernorm_backward", shape, best_time(f.reps, [&] {
          kernels::layernorm_backward(dx.data(), dw.data(), db.data(), y.data(), x.data(), w.data(),
                                      mean.data(), rstd.data(), n, c);
        }));
  }
  {
    const int64_t n = 1024 * 3072;
    std::vector<float> x(n), y(n), dx(n);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 31) * 0.2f - 3.0f;
    const std::string shape = fmt::format("n{}", n);
    row("gelu_forward", shape,
        best_time(f.reps, [&] { kernels::gelu_forward(y.data(), x.data(), n); }));
    row("gelu_backward", shape,
        best_time(f.reps, [&] { kernels::gelu_backward(dx.data(), x.data(), y.data(), n); }));
  }
  {
    const int64_t n = 124'000'000;
    std::vector<float> p(n, 0.1f), g(n, 0.01f), m(n), v(n);
    row("adamw_update", fmt::format("n{}", n), best_time(1, [&] {
          kernels::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f,
                                1e-8f, 0.1f, 1);
        }));
    row("sum_squares", fmt::format("n{}", n),
        best_time(1, [&] { (void)kernels::sum_squares(g.data(), n); }));
  }
  kernels::set_threads(saved);
  if (f.json) std::printf("%s\n", rows.dump(2).c_str());
}

void add_common(CLI::App* cmd, GemmFlags& f) {
  cmd->add_option("--threads", f.threads, "intra-op threads (default: all host cores)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", f.json, "one JSON document on stdout (the table goes to stderr)");
  cmd->add_option("--dtype", f.dtype, "f32, bf16 or all")
      ->check(CLI::IsMember({"f32", "bf16", "all"}));
}

}  // namespace

void register_bench_kernels(CLI::App& bench) {
  auto gemm_flags = std::make_shared<GemmFlags>();
  CLI::App* gemm = bench.add_subcommand("gemm", "GFLOP/s of f32 and bf16 GEMM on GPT-shaped sizes");
  add_common(gemm, *gemm_flags);
  gemm->add_option("--reps", gemm_flags->reps, "timed repetitions per size (best is kept)")
      ->check(CLI::PositiveNumber);
  gemm->callback([gemm_flags] { run_gemm(*gemm_flags); });

  auto ops_flags = std::make_shared<GemmFlags>();
  CLI::App* ops = bench.add_subcommand("ops", "time of the non-GEMM kernels at GPT-2 124M shapes");
  add_common(ops, *ops_flags);
  ops->add_option("--reps", ops_flags->reps, "timed repetitions (best is kept)")
      ->check(CLI::PositiveNumber);
  ops->callback([ops_flags] { run_ops(*ops_flags); });

  auto peak_flags = std::make_shared<GemmFlags>();
  CLI::App* peak =
      bench.add_subcommand("peak", "measure the best f32 and bf16 GEMM rate and cache it for MFU");
  add_common(peak, *peak_flags);
  peak->callback([peak_flags] { run_peak(*peak_flags); });
}

}  // namespace mt::cli
