// Deterministic reductions: column sums over rows (bias gradients) in two phases, and the
// double-precision sum / sum of squares of a vector. Every split depends only on the sizes,
// and partial results are added in a fixed order, so the bits never change run to run.
#include "kernels/cuda/context.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace mt::kernels::cuda {
namespace detail {
namespace {

// Phase 1: thread j of column block blockIdx.x sums rows [k*R, min(n, (k+1)*R)) of column j
// in order, k = blockIdx.y.
__global__ void column_partials_kernel(float* partials, const float* x, int64_t n, int64_t c,
                                       int64_t rows_per_chunk) {
  const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (j >= c) return;
  const int64_t k = blockIdx.y;
  const int64_t r0 = k * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  float acc = 0.0f;
  for (int64_t i = r0; i < r1; ++i) acc += x[i * c + j];
  partials[k * c + j] = acc;
}

// Phase 2: out[j] += the chunks' partial sums of column j, in chunk order.
__global__ void add_partials_kernel(float* out, const float* partials, int64_t chunks, int64_t c) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < c;
       j += int64_t{gridDim.x} * blockDim.x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) acc += partials[k * c + j];
    out[j] += acc;
  }
}

constexpr int kSumBlocks = 256;  // a fixed split of sum / sum_squares (not the GPU's size)

// Phase 1: block b, thread t sums (squares of) elements b*kThreads + t + k*(kSumBlocks *
// kThreads) in double, then the block adds its threads in a fixed tree.
template <bool kSquares>
__global__ void sum_partials_kernel(double* partials, const float* x, int64_t n) {
  __shared__ double shm[kThreads];
  double s = 0.0;
  const int64_t stride = int64_t{kSumBlocks} * kThreads;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n; i += stride) {
    const double v = x[i];
    s += kSquares ? v * v : v;
  }
  const double total = block_reduce(s, shm, AddOp{});
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Phase 2: one block adds the kSumBlocks partials in a fixed tree.
__global__ void sum_finish_kernel(double* result, const double* partials) {
  __shared__ double shm[kThreads];
  double s = 0.0;
  for (int i = threadIdx.x; i < kSumBlocks; i += kThreads) s += partials[i];
  const double total = block_reduce(s, shm, AddOp{});
  if (threadIdx.x == 0) *result = total;
}

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

ColumnChunks column_chunks(int64_t n, int64_t c) {
  ColumnChunks p;
  if (n <= 0) return p;
  // About 2^20 threads in phase 1 are plenty; at most 256 chunks keeps the partials small.
  const int64_t cols = c < 1 ? 1 : c;
  int64_t chunks = ((int64_t{1} << 20) + cols - 1) / cols;
  chunks = chunks < 1 ? 1 : (chunks > 256 ? 256 : chunks);
  chunks = chunks > n ? n : chunks;
  p.rows_per_chunk = (n + chunks - 1) / chunks;
  p.chunks = (n + p.rows_per_chunk - 1) / p.rows_per_chunk;
  return p;
}

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
