// Layer norm over the last dimension (eps 1e-5), as kernels/layernorm.cpp: one block per
// row for the statistics and dx; dw/db by a deterministic two-phase reduction over rows.
#include "kernels/cuda/context.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/layernorm_kernels.cuh"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

void check_ln(const char* what, int64_t n, int64_t c) {
  check_nonneg(what, "n", n);
  if (c < 1) fail_input(std::string(what) + ": c must be >= 1, got " + str(c));
  if (n > INT32_MAX) fail_input(std::string(what) + ": n=" + str(n) + " rows exceed 2^31-1");
}

}  // namespace

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t n, int64_t c) {
  check_ln("layernorm_forward", n, c);
  if (n == 0) return;
  layernorm_forward_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(y, mean, rstd, x, w,
                                                                                b, c);
  check_launch("layernorm_forward_kernel");
}

void layernorm_forward(bf16* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t n, int64_t c) {
  check_ln("layernorm_forward", n, c);
  if (n == 0) return;
  layernorm_forward_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(
      reinterpret_cast<uint16_t*>(y), mean, rstd, x, w, b, c);
  check_launch("layernorm_forward_kernel");
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t n,
                        int64_t c) {
  check_ln("layernorm_backward", n, c);
  if (n == 0) return;
  layernorm_backward_dx_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(dx, dy, x, w,
                                                                                    mean, rstd, c);
  check_launch("layernorm_backward_dx_kernel");
  const ColumnChunks p = column_chunks(n, c);
  const size_t part = static_cast<size_t>(p.chunks * c);
  auto* pw = static_cast<float*>(scratch(Scratch::kPartials, 2 * part * sizeof(float)));
  float* pb = db ? pw + part : nullptr;
  const dim3 grid(static_cast<unsigned>((c + kThreads - 1) / kThreads),
                  static_cast<unsigned>(p.chunks));
  layernorm_backward_partials_kernel<<<grid, kThreads, 0, stream()>>>(pw, pb, dy, x, mean, rstd, n,
                                                                      c, p.rows_per_chunk);
  check_launch("layernorm_backward_partials_kernel");
  add_partials(dw, pw, p.chunks, c);
  if (db) add_partials(db, pb, p.chunks, c);
}

}  // namespace mt::kernels::cuda
