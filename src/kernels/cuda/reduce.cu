// Deterministic reductions: column sums over rows (bias gradients) in two phases, and the
// double-precision sum / sum of squares of a vector. Every split depends only on the sizes,
// and partial results are added in a fixed order, so the bits never change run to run.
#include "kernels/cuda/context.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/reduce_kernels.cuh"

namespace mt::kernels::cuda {
namespace detail {
namespace {

template <bool kSquares>
double sum_impl(const char* what, const float* x, int64_t n) {
  check_nonneg(what, "n", n);
  if (n == 0) return 0.0;
  auto* partials = static_cast<double*>(scratch(Scratch::kPartials, (kSumBlocks + 1) * sizeof(double)));
  sum_partials_kernel<kSquares><<<kSumBlocks, kThreads, 0, stream()>>>(partials, x, n);
  check_launch(kSquares ? "sum_partials_kernel<squares>" : "sum_partials_kernel");
  sum_finish_kernel<<<1, kThreads, 0, stream()>>>(partials + kSumBlocks, partials);
  check_launch("sum_finish_kernel");
  Context& ctx = context();
  check_cuda(cudaMemcpyAsync(ctx.host_result, partials + kSumBlocks, sizeof(double),
                             cudaMemcpyDeviceToHost, stream()),
             "cudaMemcpyAsync (sum result to host)");
  check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (sum result)");
  return *ctx.host_result;
}

}  // namespace

void add_partials(float* out, const float* partials, int64_t chunks, int64_t c) {
  if (c == 0 || chunks == 0) return;
  add_partials_kernel<<<grid_for(c), kThreads, 0, stream()>>>(out, partials, chunks, c);
  check_launch("add_partials_kernel");
}

void add_column_sums(float* out, const float* x, int64_t n, int64_t c) {
  check_nonneg("column sums", "n", n);
  check_nonneg("column sums", "c", c);
  if (n == 0 || c == 0) return;
  const ColumnChunks p = column_chunks(n, c);
  auto* partials = static_cast<float*>(
      scratch(Scratch::kPartials, static_cast<size_t>(p.chunks * c) * sizeof(float)));
  const dim3 grid(static_cast<unsigned>((c + kThreads - 1) / kThreads),
                  static_cast<unsigned>(p.chunks));
  column_partials_kernel<<<grid, kThreads, 0, stream()>>>(partials, x, n, c, p.rows_per_chunk);
  check_launch("column_partials_kernel");
  add_partials(out, partials, p.chunks, c);
}

}  // namespace detail

double sum_squares(const float* x, int64_t n) { return detail::sum_impl<true>("sum_squares", x, n); }
double sum(const float* x, int64_t n) { return detail::sum_impl<false>("sum", x, n); }

}  // namespace mt::kernels::cuda
