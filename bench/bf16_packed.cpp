// The bf16 GEMMs of Model M's linears (d_model 768, d_ff 3072, vocab 50304, n = 1024 rows:
// seq 256 x batch 4) on one thread: the packed-panel kernel (kernels/bf16_packed.h, called
// directly) and oneDNN's matmul (kernels::gemm_bf16 with MT_BF16_PACKED=0), alternating, each the
// median of --reps timings after a warm-up. Prints the host's CPU model, a markdown table of
// GFLOP/s and the ratio packed / oneDNN per GEMM (the forward y = x·Wᵀ, the input gradient
// dx = dy·W, the weight gradient dW += dyᵀ·x), and the sums. Built as `bf16_packed_bench`;
// `bench/bf16-packed` runs it.
#include "kernels/bf16_packed.h"

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
#include "obs/run_info.h"

namespace {

using namespace mt;

struct Shape {
  const char* name;
  bool ta, tb;
  int64_t M, N, K;
  float beta;
};

constexpr int64_t kRows = 1024;
const Shape kShapes[] = {
    {"qkv y = x·Wᵀ", false, true, kRows, 2304, 768, 0},
    {"proj y = x·Wᵀ", false, true, kRows, 768, 768, 0},
    {"fc y = x·Wᵀ", false, true, kRows, 3072, 768, 0},
    {"fc2 y = x·Wᵀ", false, true, kRows, 768, 3072, 0},
    {"lm_head y = x·Wᵀ", false, true, kRows, 50304, 768, 0},
    {"qkv dx = dy·W", false, false, kRows, 768, 2304, 0},
    {"proj dx = dy·W", false, false, kRows, 768, 768, 0},
    {"fc dx = dy·W", false, false, kRows, 768, 3072, 0},
    {"fc2 dx = dy·W", false, false, kRows, 3072, 768, 0},
    {"lm_head dx = dy·W", false, false, kRows, 768, 50304, 0},
    {"qkv dW += dyᵀ·x", true, false, 2304, 768, kRows, 1},
    {"fc dW += dyᵀ·x", true, false, 3072, 768, kRows, 1},
    {"fc2 dW += dyᵀ·x", true, false, 768, 3072, kRows, 1},
    {"lm_head dW += dyᵀ·x", true, false, 50304, 768, kRows, 1},
};

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bf16_packed_bench [--reps N]\n");
      return 2;
    }
  }
  if (!kernels::packed::on()) {
    unsetenv("MT_BF16_PACKED");
    if (!kernels::packed::on()) {
      std::printf(
          "bf16_packed_bench: this CPU runs no packed panels (AVX512-BF16 without AMX): "
          "nothing to compare\n");
      return 0;
    }
  }
  kernels::set_threads(1);
  fmt::print("CPU: {}; one thread; median of {} timings per cell, the two GEMMs alternating\n\n",
             obs::cpu_model(), reps);
  fmt::print("| GEMM | M | N | K | oneDNN GFLOP/s | packed GFLOP/s | packed / oneDNN |\n");
  fmt::print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  double sum[2][2] = {{0, 0}, {0, 0}};  // [A row-major or not][oneDNN, packed] seconds
  for (const Shape& s : kShapes) {
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    std::vector<bf16> A((s.ta ? s.K : s.M) * lda), B((s.tb ? s.N : s.K) * ldb);
    for (size_t i = 0; i < A.size(); ++i) A[i] = bf16(float(int(i * 7919 % 17) - 8) / 64.0f);
    for (size_t i = 0; i < B.size(); ++i) B[i] = bf16(float(int(i * 104729 % 13) - 6) / 64.0f);
    std::vector<float> C(s.M * s.N, 0.0f);
    std::vector<double> t[2];
    const kernels::packed::Operand a{A.data(), s.ta ? 1 : lda, s.ta ? lda : 1};
    const kernels::packed::Operand b{B.data(), s.tb ? 1 : ldb, s.tb ? ldb : 1};
    for (int r = 0; r <= reps; ++r)
      for (int v = 0; v < 2; ++v) {
        const double t0 = now_s();
        if (v == 0) {  // oneDNN, through the library
          setenv("MT_BF16_PACKED", "0", 1);
          kernels::gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, s.beta,
                             C.data(), s.N);
          unsetenv("MT_BF16_PACKED");
        } else if (!kernels::packed::gemm(s.M, s.N, s.K, a, b, C.data(), s.N, false, s.beta != 0.0f,
                                          nullptr, nullptr)) {
          std::fprintf(stderr, "bf16_packed_bench: the packed GEMM refused %s\n", s.name);
          return 1;
        }
        if (r > 0) t[v].push_back(now_s() - t0);  // the first: warm-up
      }
    const double flops = 2.0 * s.M * s.N * s.K, d = median(t[0]), p = median(t[1]);
    sum[s.ta][0] += d, sum[s.ta][1] += p;
    fmt::print("| {} | {} | {} | {} | {:.0f} | {:.0f} | {:.3f}x |\n", s.name, s.M, s.N, s.K,
               flops / d / 1e9, flops / p / 1e9, d / p);
    std::fflush(stdout);
  }
  fmt::print(
      "| forward and input gradients, summed | | | | {:.1f} ms | {:.1f} ms | "
      "{:.3f}x |\n",
      sum[0][0] * 1e3, sum[0][1] * 1e3, sum[0][0] / sum[0][1]);
  fmt::print("| weight gradients, summed | | | | {:.1f} ms | {:.1f} ms | {:.3f}x |\n",
             sum[1][0] * 1e3, sum[1][1] * 1e3, sum[1][0] / sum[1][1]);
  return 0;
}
