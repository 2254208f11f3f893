// Fused softmax + cross-entropy over a vocabulary padded from V to Vp columns, as
// kernels/cross_entropy.cpp. A target outside [0, V) cannot throw from the GPU without a
// wait: its row gets a NaN loss and lse (and NaN gradients), which the training loop's NaN
// check reports.
#include <cmath>

#include "kernels/cuda/context.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

__global__ void cross_entropy_forward_kernel(float* losses, float* lse, const float* logits,
                                             const int32_t* targets, int64_t V, int64_t Vp) {
  __shared__ float shm[kThreads];
  const int64_t i = blockIdx.x;
  const float* x = logits + i * Vp;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) mx = fmaxf(mx, x[j]);
  mx = block_reduce(mx, shm, MaxOp{});
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) s += expf(x[j] - mx);
  s = block_reduce(s, shm, AddOp{});
  if (threadIdx.x == 0) {
    const int64_t t = targets[i];
    const bool ok = t >= 0 && t < V;
    const float l = mx + logf(s);
    lse[i] = ok ? l : NAN;
    losses[i] = ok ? l - x[t] : NAN;
  }
}

// Element (i, j): (exp(x - lse) - [j == target]) * dloss for j < V, 0 on padding. Each
// element is read and written by the same thread, so dlogits may alias logits.
__global__ void cross_entropy_backward_kernel(float* dlogits, const float* logits, const float* lse,
                                              const int32_t* targets, float dloss, int64_t n,
                                              int64_t V, int64_t Vp) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n * Vp;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / Vp, j = e % Vp;
    const int64_t t = targets[i];
    float d = 0.0f;
    if (t < 0 || t >= V)
      d = NAN;
    else if (j < V)
      d = (expf(logits[e] - lse[i]) - (j == t ? 1.0f : 0.0f)) * dloss;
    dlogits[e] = d;
  }
}

void check_ce(const char* what, int64_t n, int64_t V, int64_t Vp) {
  check_nonneg(what, "n", n);
  if (V < 1 || Vp < V)
    fail_input(std::string(what) + ": need 1 <= V <= Vp, got V=" + str(V) + " Vp=" + str(Vp));
  if (n > INT32_MAX) fail_input(std::string(what) + ": n=" + str(n) + " rows exceed 2^31-1");
}

}  // namespace

void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int64_t n, int64_t V, int64_t Vp) {
  check_ce("cross_entropy_forward", n, V, Vp);
  if (n == 0) return;
  cross_entropy_forward_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(
      losses, lse, logits, targets, V, Vp);
  check_launch("cross_entropy_forward_kernel");
}

void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int64_t n, int64_t V, int64_t Vp) {
  check_ce("cross_entropy_backward", n, V, Vp);
  if (n == 0) return;
  cross_entropy_backward_kernel<<<grid_for(n * Vp), kThreads, 0, stream()>>>(
      dlogits, logits, lse, targets, dloss, n, V, Vp);
  check_launch("cross_entropy_backward_kernel");
}

}  // namespace mt::kernels::cuda
