// Mixed-precision linear (kernels/mixed.h: bf16 operands, f32 accumulation, f32 gradients)
// against the f32 linear (kernels.h) on the Model M shapes: forward + backward time of
// each, and the ratio f32 / mixed. Built as `mixed_linear_bench`.
//
//   mixed_linear_bench [--threads 1,2] [--reps 5] [--no-lm-head] [--json]
//
// Model M (bench/results/vs-pytorch.md): d_model 768, d_ff 3072, seq 256, batch 4, so the
// linears see n = 1024 rows. Each timing is the median of --reps after one warm-up; the
// mixed backward includes rounding dy to bf16 (into a workspace allocated before timing).
// Prints a markdown table (bench/record summarises repetitions of it: `make bench`), with
// the host's CPU model above it.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/dtype.h"
#include "kernels/kernels.h"
#include "kernels/mixed.h"

namespace {

using namespace mt;

struct Case {
  const char* name;
  int64_t in, out;
};

constexpr int64_t kRows = 4 * 256;  // batch 4 x seq 256
const Case kBlock[] = {{"attn.qkv", 768, 2304},
                       {"attn.proj", 768, 768},
                       {"mlp.fc", 768, 3072},
                       {"mlp.proj", 3072, 768}};
const Case kLmHead = {"lm_head", 768, 50304};

struct Times {
  double fwd_s = 1e30, bwd_s = 1e30;
  double total() const { return fwd_s + bwd_s; }
};

std::vector<float> filled(int64_t n, float scale) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 7919) % 17 - 8) / 8.0f;
  return v;
}

template <class F>
double median_of(int reps, F&& f) {
  f();  // warm-up: builds and caches the oneDNN primitives, faults in the pages
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    f();
    t.push_back(now_s() - t0);
  }
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

std::string cpu_model() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (!f) return "unknown";
  char line[512];
  std::string model = "unknown";
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "model name", 10) == 0) {
      const char* colon = std::strchr(line, ':');
      if (colon) model = colon + 2;
      while (!model.empty() && (model.back() == '\n' || model.back() == ' ')) model.pop_back();
      break;
    }
  std::fclose(f);
  return model;
}

std::pair<Times, Times> run_case(const Case& c, int reps) {
  const int64_t n = kRows, in = c.in, out = c.out;
  const auto x = filled(n * in, 1.0f), w = filled(out * in, 0.02f), b = filled(out, 0.1f);
  const auto dy = filled(n * out, 1e-3f);
  std::vector<float> y(n * out), dx(n * in), dw(out * in, 0.0f), db(out, 0.0f);
  Times f32, mixed;
  f32.fwd_s = median_of(
      reps, [&] { kernels::linear_forward(y.data(), x.data(), w.data(), b.data(), n, in, out); });
  f32.bwd_s = median_of(reps, [&] {
    kernels::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), n, in,
                             out);
  });
  std::vector<bf16> xh(n * in), wh(out * in), ws(kernels::linear_backward_mixed_ws_elems(n, out));
  kernels::to_bf16(xh.data(), x.data(), n * in);
  kernels::to_bf16(wh.data(), w.data(), out * in);
  mixed.fwd_s = median_of(reps, [&] {
    kernels::linear_forward_mixed(y.data(), xh.data(), wh.data(), b.data(), n, in, out);
  });
  mixed.bwd_s = median_of(reps, [&] {
    kernels::linear_backward_mixed(dx.data(), dw.data(), db.data(), dy.data(), xh.data(), wh.data(),
                                   n, in, out, ws.data(), static_cast<int64_t>(ws.size()));
  });
  return {f32, mixed};
}

void usage_error(const char* what) {
  std::fprintf(stderr,
               "mixed_linear_bench: %s\nusage: mixed_linear_bench [--threads 1,2] "
               "[--reps N] [--no-lm-head] [--json]\n",
               what);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  int reps = 5;
  bool lm_head = true, json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads.clear();
      for (const char* p = argv[++i]; *p;) {
        char* end;
        const long t = std::strtol(p, &end, 10);
        if (end == p || t < 1) usage_error("--threads takes a list like 1,2 of counts >= 1");
        threads.push_back(static_cast<int>(t));
        p = *end == ',' ? end + 1 : end;
      }
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
      if (reps < 1) usage_error("--reps must be >= 1");
    } else if (a == "--no-lm-head") {
      lm_head = false;
    } else if (a == "--json") {
      json = true;
    } else {
      usage_error(("unknown argument " + a).c_str());
    }
  }
  std::vector<Case> cases(std::begin(kBlock), std::end(kBlock));
  if (lm_head) cases.push_back(kLmHead);

  std::FILE* human = json ? stderr : stdout;
  std::string rows;
  fmt::print(human, "CPU: {}; rows n = {}; median of {} timings per cell\n\n", cpu_model(), kRows,
             reps);
  fmt::print(
      human,
      "| linear | in | out | threads | f32 fwd ms | f32 bwd ms | bf16 fwd ms | bf16 bwd ms | "
      "fwd f32/bf16 | bwd f32/bf16 | total f32/bf16 |\n");
  fmt::print(human,
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int t : threads) {
    kernels::set_threads(t);
    Times block_f32, block_mixed;  // the four linears of one transformer block, summed
    block_f32.fwd_s = block_f32.bwd_s = block_mixed.fwd_s = block_mixed.bwd_s = 0;
    auto print = [&](const char* name, int64_t in, int64_t out, const Times& f, const Times& m) {
      fmt::print(human,
                 "| {} | {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f}x | {:.2f}x | "
                 "{:.2f}x |\n",
                 name, in, out, t, f.fwd_s * 1e3, f.bwd_s * 1e3, m.fwd_s * 1e3, m.bwd_s * 1e3,
                 f.fwd_s / m.fwd_s, f.bwd_s / m.bwd_s, f.total() / m.total());
      std::fflush(human);
      rows += fmt::format(
          "{}\n {{\"op\": \"linear\", \"case\": \"{}\", \"n\": {}, \"in\": {}, \"out\": {}, "
          "\"threads\": {}, \"f32_fwd_s\": {:.6g}, \"f32_bwd_s\": {:.6g}, \"mixed_fwd_s\": {:.6g}, "
          "\"mixed_bwd_s\": {:.6g}, \"time_s\": {:.6g}, \"speedup\": {:.4g}}}",
          rows.empty() ? "" : ",", name, kRows, in, out, t, f.fwd_s, f.bwd_s, m.fwd_s, m.bwd_s,
          m.total(), f.total() / m.total());
    };
    for (const Case& c : cases) {
      const auto [f, m] = run_case(c, reps);
      print(c.name, c.in, c.out, f, m);
      if (&c - cases.data() < static_cast<std::ptrdiff_t>(std::size(kBlock))) {
        block_f32.fwd_s += f.fwd_s, block_f32.bwd_s += f.bwd_s;
        block_mixed.fwd_s += m.fwd_s, block_mixed.bwd_s += m.bwd_s;
      }
    }
    print("block", 0, 0, block_f32, block_mixed);
  }
  if (json) std::printf("[%s\n]\n", rows.c_str());
  return 0;
}
