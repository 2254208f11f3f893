// Mixed-precision kernels (mixed.h): bf16 conversions with core/dtype.h's exact rounding,
// the linear layer on bf16 operands (cuBLASLt, f32 accumulation), and its backward with dy
// rounded to bf16 in row chunks exactly as kernels/mixed.cpp does.
#include "kernels/cuda/context.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/mixed_kernels.cuh"

// The kernels (in the *_kernels.cuh) are done with it.
#undef MT_GRID_STRIDE

namespace mt::kernels::cuda {
namespace {

using namespace detail;

void check_linear(const char* what, int64_t n, int64_t in, int64_t out) {
  check_nonneg(what, "n", n);
  check_nonneg(what, "in", in);
  check_nonneg(what, "out", out);
}

}  // namespace

void to_bf16(bf16* y, const float* x, int64_t n) {
  check_nonneg("to_bf16", "n", n);
  if (n == 0) return;
  to_bf16_kernel<<<grid_for(n), kThreads, 0, stream()>>>(reinterpret_cast<uint16_t*>(y), x, n);
  check_launch("to_bf16_kernel");
}

void to_f32(float* y, const bf16* x, int64_t n) {
  check_nonneg("to_f32", "n", n);
  if (n == 0) return;
  to_f32_kernel<<<grid_for(n), kThreads, 0, stream()>>>(y, reinterpret_cast<const uint16_t*>(x), n);
  check_launch("to_f32_kernel");
}

void linear_forward_mixed(float* y, const bf16* x, const bf16* w, const float* b, int64_t n,
                          int64_t in, int64_t out) {
  check_linear("linear_forward_mixed", n, in, out);
  if (n == 0 || out == 0) return;
  // in == 0: gemm_bf16 writes zeros (beta = 0), then y = b. Its leading dims must be >= 1
  // even then (as the CPU's check_dims says), so ld is 1 for an empty x and w.
  const int64_t ld = in > 0 ? in : 1;
  gemm_bf16(false, true, n, out, in, 1.0f, x, ld, w, ld, 0.0f, y, out);
  if (b) launch_add_bias(y, b, n, out);
}

void linear_forward_mixed(bf16* y, const bf16* x, const bf16* w, const float* b, int64_t n,
                          int64_t in, int64_t out) {
  check_linear("linear_forward_mixed", n, in, out);
  if (n == 0 || out == 0) return;
  // The f32 product goes to a scratch buffer, then bias and one rounding in one pass.
  auto* acc =
      static_cast<float*>(scratch(Scratch::kTemp, static_cast<size_t>(n * out) * sizeof(float)));
  const int64_t ld = in > 0 ? in : 1;  // in == 0: acc = 0, y = bf16(b) (see above)
  gemm_bf16(false, true, n, out, in, 1.0f, x, ld, w, ld, 0.0f, acc, out);
  bias_round_kernel<<<grid_for(n * out), kThreads, 0, stream()>>>(reinterpret_cast<uint16_t*>(y),
                                                                  acc, b, n, out);
  check_launch("bias_round_kernel");
}

void linear_backward_mixed(float* dx, float* dw, float* db, const float* dy, const bf16* x,
                           const bf16* w, int64_t n, int64_t in, int64_t out, bf16* ws,
                           int64_t ws_elems) {
  check_linear("linear_backward_mixed", n, in, out);
  if (n == 0 || out == 0) {
    if (dx && n > 0 && in > 0)
      check_cuda(cudaMemsetAsync(dx, 0, static_cast<size_t>(n * in) * sizeof(float), stream()),
                 "cudaMemsetAsync (linear_backward_mixed dx)");
    return;
  }
  // db from the f32 dy (all rows at once: the chunking below only changes the order of the
  // additions on the CPU, and this order is fixed too).
  if (db) add_column_sums(db, dy, n, out);
  if (!dx && !dw) return;
  if (!ws || ws_elems < out)
    fail_input("linear_backward_mixed: the bf16 workspace holds " + str(ws ? ws_elems : 0) +
               " elements, fewer than one row of dy (out=" + str(out) +
               "); give it linear_backward_mixed_ws_elems(n, out) = " + str(n * out) +
               " for one pass");
  const int64_t chunk = ws_elems / out < n ? ws_elems / out : n;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = chunk < n - r0 ? chunk : n - r0;
    to_bf16(ws, dy + r0 * out, rows * out);
    if (in == 0) continue;
    // dx[rows, in] = dy[rows, out] * w[out, in]
    if (dx) gemm_bf16(false, false, rows, in, out, 1.0f, ws, out, w, in, 0.0f, dx + r0 * in, in);
    // dw[out, in] += dy[rows, out]^T * x[rows, in], added in f32 (beta = 1)
    if (dw) gemm_bf16(true, false, out, in, rows, 1.0f, ws, out, x + r0 * in, in, 1.0f, dw, in);
  }
}

}  // namespace mt::kernels::cuda
