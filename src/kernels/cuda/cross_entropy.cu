// Fused softmax + cross-entropy over a vocabulary padded from V to Vp columns, as
// kernels/cross_entropy.cpp. A target outside [0, V) cannot throw from the GPU without a
// wait: its row gets a NaN loss and lse (and NaN gradients), which the training loop's NaN
// check reports.
#include <cmath>

#include "kernels/cuda/context.h"
#include "kernels/cuda/cross_entropy_kernels.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

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
