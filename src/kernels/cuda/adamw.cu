// AdamW, as kernels/adamw.cpp: the same operations in the same order, each rounded to f32
// on its own (__fmul_rn / __fadd_rn / __fsub_rn keep nvcc from fusing them into FMAs; sqrt
// and division are IEEE by default), and the bias corrections computed on the host exactly
// as the CPU does. adamw_update_multi runs every segment in one launch: the segment table
// goes to the device through a pinned buffer, and each block finds its segment by a binary
// search over the segments' first blocks.
#include <cmath>

#include "kernels/cuda/adamw_kernels.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace mt::kernels::cuda {
namespace {

using namespace detail;

struct Corrections {
  float c1, c2;
};

Corrections corrections(float beta1, float beta2, int64_t t, const char* what) {
  if (t < 1) fail_input(std::string(what) + ": step t must be >= 1, got " + str(t));
  const float c1 = 1.0f / static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  const float c2 = 1.0f / static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
  return {c1, c2};
}

void launch_adamw(const char* what, float* param, uint16_t* param_bf16, const float* grad,
                  float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                  float wd, int64_t t) {
  const Corrections c = corrections(beta1, beta2, t, what);
  check_nonneg(what, "n", n);
  if (n == 0) return;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream()>>>(param, param_bf16, grad, m, v, n, lr, beta1,
                                                       beta2, eps, wd, c.c1, c.c2);
  check_launch("adamw_kernel");
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t) {
  launch_adamw("adamw_update", param, nullptr, grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
               t);
}

void adamw_update_mixed(float* master, bf16* param_out, const float* grad, float* m, float* v,
                        int64_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int64_t t) {
  if (!param_out) fail_input("adamw_update_mixed: param_out (the bf16 copy) is null");
  launch_adamw("adamw_update_mixed", master, reinterpret_cast<uint16_t*>(param_out), grad, m, v, n,
               lr, beta1, beta2, eps, weight_decay, t);
}

void adamw_update_multi(float* param, const float* grad, float* m, float* v,
                        const AdamwSegment* segs, int64_t n_segs, float lr, float beta1,
                        float beta2, float eps, int64_t t, float grad_scale) {
  const Corrections c = corrections(beta1, beta2, t, "adamw_update_multi");
  check_nonneg("adamw_update_multi", "n_segs", n_segs);
  if (n_segs == 0) return;
  const size_t bytes = static_cast<size_t>(n_segs) * sizeof(DeviceSegment);
  auto* host = static_cast<DeviceSegment*>(host_staging(bytes));
  int64_t blocks = 0;
  for (int64_t k = 0; k < n_segs; ++k) {
    const AdamwSegment& g = segs[k];
    if (g.offset < 0 || g.n < 0)
      fail_input("adamw_update_multi: segment " + str(k) + " has offset=" + str(g.offset) +
                 " n=" + str(g.n) + " (both must be >= 0)");
    host[k] = DeviceSegment{g.offset, g.n, blocks, g.weight_decay, 0.0f,
                            reinterpret_cast<uint16_t*>(g.bf16_out)};
    blocks += segment_blocks(g.n);
  }
  if (blocks == 0) return;
  if (blocks > INT32_MAX)
    fail_input("adamw_update_multi: " + str(blocks) + " blocks exceed 2^31-1");
  auto* dev = static_cast<DeviceSegment*>(scratch(Scratch::kTable, bytes));
  check_cuda(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream()),
             "cudaMemcpyAsync (adamw segment table)");
  staging_copied();
  adamw_multi_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(
      param, grad, m, v, dev, n_segs, lr, beta1, beta2, eps, c.c1, c.c2, grad_scale);
  check_launch("adamw_multi_kernel");
}

}  // namespace mt::kernels::cuda
