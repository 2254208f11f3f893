// The linear layer on top of gemm: y = x w^T + b, and its backward.
#include "kernels/cuda/context.h"
#include "kernels/cuda/kernels_cuda.h"

namespace mt::kernels::cuda {
namespace {

void check_linear(const char* what, int64_t n, int64_t in, int64_t out) {
  detail::check_nonneg(what, "n", n);
  detail::check_nonneg(what, "in", in);
  detail::check_nonneg(what, "out", out);
}

}  // namespace

void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t n, int64_t in,
                    int64_t out) {
  check_linear("linear_forward", n, in, out);
  gemm(false, true, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
  if (b) detail::launch_add_bias(y, b, n, out);
}

void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, int64_t n, int64_t in, int64_t out) {
  check_linear("linear_backward", n, in, out);
  if (dx) gemm(false, false, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
  if (dw) gemm(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
  if (db) detail::add_column_sums(db, dy, n, out);
}

}  // namespace mt::kernels::cuda
