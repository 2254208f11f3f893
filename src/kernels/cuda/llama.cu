// The Llama-family parts on a GPU (kernels.h: rmsnorm_*, rope_*, swiglu_*, *_kv_heads), with
// their CPU twins' arguments and meaning; the device code is llama_kernels.cuh.
#include "kernels/cuda/context.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/llama_kernels.cuh"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

void check_rows(const char* what, int64_t n, int64_t c) {
  check_nonneg(what, "n", n);
  if (c < 1) fail_input(std::string(what) + ": c must be >= 1, got " + str(c));
  if (n > INT32_MAX) fail_input(std::string(what) + ": n=" + str(n) + " rows exceed 2^31-1");
}

void check_heads(const char* what, int64_t heads, int64_t kv_heads, int64_t hd) {
  if (heads < 1 || kv_heads < 1 || hd < 1 || heads % kv_heads != 0)
    fail_input(std::string(what) + ": heads " + str(heads) + " must be a multiple of kv_heads " +
               str(kv_heads) + ", both >= 1, head dim " + str(hd) + " >= 1");
}

void rope(const char* what, float* x, int64_t B, int64_t T, int64_t row_stride, int64_t col0,
          int64_t heads, int64_t hd, const float* cos, const float* sin, float sign) {
  check_nonneg(what, "B", B);
  check_nonneg(what, "T", T);
  check_nonneg(what, "heads", heads);
  if (hd < 2 || hd % 2 != 0)
    fail_input(std::string(what) + ": head dim " + str(hd) + " must be even");
  const int64_t total = B * T * heads * (hd / 2);
  if (total == 0) return;
  rope_kernel<<<grid_for(total), kThreads, 0, stream()>>>(x, T, row_stride, col0, heads, hd, cos,
                                                          sin, sign, total);
  check_launch("rope_kernel");
}

}  // namespace

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t n, int64_t c,
                     float eps) {
  check_rows("rmsnorm_forward", n, c);
  if (n == 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(y, rstd, x, w, c,
                                                                              eps);
  check_launch("rmsnorm_forward_kernel");
}

void rmsnorm_forward(bf16* y, float* rstd, const float* x, const float* w, int64_t n, int64_t c,
                     float eps) {
  check_rows("rmsnorm_forward", n, c);
  if (n == 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(
      reinterpret_cast<uint16_t*>(y), rstd, x, w, c, eps);
  check_launch("rmsnorm_forward_kernel");
}

void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t n, int64_t c) {
  check_rows("rmsnorm_backward", n, c);
  if (n == 0) return;
  rmsnorm_backward_dx_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(dx, dy, x, w,
                                                                                  rstd, c);
  check_launch("rmsnorm_backward_dx_kernel");
  const ColumnChunks p = column_chunks(n, c);
  auto* pw = static_cast<float*>(
      scratch(Scratch::kPartials, static_cast<size_t>(p.chunks * c) * sizeof(float)));
  const dim3 grid(static_cast<unsigned>((c + kThreads - 1) / kThreads),
                  static_cast<unsigned>(p.chunks));
  rmsnorm_backward_partials_kernel<<<grid, kThreads, 0, stream()>>>(pw, dy, x, rstd, n, c,
                                                                    p.rows_per_chunk);
  check_launch("rmsnorm_backward_partials_kernel");
  add_partials(dw, pw, p.chunks, c);
}

void rope_forward(float* x, int64_t B, int64_t T, int64_t row_stride, int64_t col0, int64_t heads,
                  int64_t hd, const float* cos, const float* sin) {
  rope("rope_forward", x, B, T, row_stride, col0, heads, hd, cos, sin, 1.0f);
}

void rope_backward(float* dx, int64_t B, int64_t T, int64_t row_stride, int64_t col0, int64_t heads,
                   int64_t hd, const float* cos, const float* sin) {
  rope("rope_backward", dx, B, T, row_stride, col0, heads, hd, cos, sin, -1.0f);
}

void swiglu_forward(float* y, const float* h, int64_t n, int64_t f) {
  check_rows("swiglu_forward", n, f);
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n * f), kThreads, 0, stream()>>>(y, h, f, n * f);
  check_launch("swiglu_forward_kernel");
}

void swiglu_forward(bf16* y, const float* h, int64_t n, int64_t f) {
  check_rows("swiglu_forward", n, f);
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n * f), kThreads, 0, stream()>>>(reinterpret_cast<uint16_t*>(y),
                                                                    h, f, n * f);
  check_launch("swiglu_forward_kernel");
}

void swiglu_backward(float* dh, const float* h, const float* dy, int64_t n, int64_t f) {
  check_rows("swiglu_backward", n, f);
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n * f), kThreads, 0, stream()>>>(dh, h, dy, f, n * f);
  check_launch("swiglu_backward_kernel");
}

void expand_kv_heads(float* full, const float* qkv, int64_t n, int64_t heads, int64_t kv_heads,
                     int64_t hd) {
  check_nonneg("expand_kv_heads", "n", n);
  check_heads("expand_kv_heads", heads, kv_heads, hd);
  const int64_t total = n * 3 * heads * hd;
  if (total == 0) return;
  expand_kv_heads_kernel<<<grid_for(total), kThreads, 0, stream()>>>(full, qkv, heads, kv_heads, hd,
                                                                     total);
  check_launch("expand_kv_heads_kernel");
}

void reduce_kv_heads(float* dqkv, const float* dfull, int64_t n, int64_t heads, int64_t kv_heads,
                     int64_t hd) {
  check_nonneg("reduce_kv_heads", "n", n);
  check_heads("reduce_kv_heads", heads, kv_heads, hd);
  const int64_t total = n * (heads + 2 * kv_heads) * hd;
  if (total == 0) return;
  reduce_kv_heads_kernel<<<grid_for(total), kThreads, 0, stream()>>>(dqkv, dfull, heads, kv_heads,
                                                                     hd, total);
  check_launch("reduce_kv_heads_kernel");
}

}  // namespace mt::kernels::cuda
