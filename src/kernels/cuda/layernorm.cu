// Layer norm over the last dimension (eps 1e-5), as kernels/layernorm.cpp: one block per
// row for the statistics and dx; dw/db by a deterministic two-phase reduction over rows.
#include "kernels/cuda/context.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

// Row blockIdx.x: mean, then the variance of the centred values (two passes, like the CPU),
// rstd = 1 / sqrt(var + 1e-5), y = (x - mean) * rstd * w (+ b).
__global__ void layernorm_forward_kernel(float* y, float* mean, float* rstd, const float* x,
                                         const float* w, const float* b, int64_t c) {
  __shared__ float shm[kThreads];
  const int64_t i = blockIdx.x;
  const float* xi = x + i * c;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) s += xi[j];
  const float m = block_reduce(s, shm, AddOp{}) / static_cast<float>(c);
  float v = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) v += (xi[j] - m) * (xi[j] - m);
  const float r = 1.0f / sqrtf(block_reduce(v, shm, AddOp{}) / static_cast<float>(c) + 1e-5f);
  float* yi = y + i * c;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) {
    const float n = (xi[j] - m) * r * w[j];
    yi[j] = b ? n + b[j] : n;
  }
  if (threadIdx.x == 0) {
    mean[i] = m;
    rstd[i] = r;
  }
}

// Row blockIdx.x of dx (accumulated): dx += (dy*w - mean(dy*w) - xhat * mean(dy*w*xhat)) * rstd.
__global__ void layernorm_backward_dx_kernel(float* dx, const float* dy, const float* x,
                                             const float* w, const float* mean, const float* rstd,
                                             int64_t c) {
  __shared__ float shm[kThreads];
  const int64_t i = blockIdx.x;
  const float* xi = x + i * c;
  const float* dyi = dy + i * c;
  const float m = mean[i], r = rstd[i];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) {
    const float g = dyi[j] * w[j];
    sg += g;
    sgx += g * (xi[j] - m) * r;
  }
  const float mg = block_reduce(sg, shm, AddOp{}) / static_cast<float>(c);
  const float mgx = block_reduce(sgx, shm, AddOp{}) / static_cast<float>(c);
  float* dxi = dx + i * c;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) {
    const float xhat = (xi[j] - m) * r;
    dxi[j] += (dyi[j] * w[j] - mg - xhat * mgx) * r;
  }
}

// Phase 1 of dw/db: column j, rows of chunk blockIdx.y in order.
__global__ void layernorm_backward_partials_kernel(float* pw, float* pb, const float* dy,
                                                   const float* x, const float* mean,
                                                   const float* rstd, int64_t n, int64_t c,
                                                   int64_t rows_per_chunk) {
  const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (j >= c) return;
  const int64_t k = blockIdx.y;
  const int64_t r0 = k * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  float aw = 0.0f, ab = 0.0f;
  for (int64_t i = r0; i < r1; ++i) {
    const float d = dy[i * c + j];
    aw += d * (x[i * c + j] - mean[i]) * rstd[i];
    ab += d;
  }
  pw[k * c + j] = aw;
  if (pb) pb[k * c + j] = ab;
}

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
  layernorm_forward_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(y, mean, rstd, x,
                                                                                w, b, c);
  check_launch("layernorm_forward_kernel");
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t n,
                        int64_t c) {
  check_ln("layernorm_backward", n, c);
  if (n == 0) return;
  layernorm_backward_dx_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(
      dx, dy, x, w, mean, rstd, c);
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
