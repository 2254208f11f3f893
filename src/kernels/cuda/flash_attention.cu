// Fused causal attention, flash-attention-2 style, on bf16 tensor cores: the host side (the
// launches, their shared-memory sizes, the shape checks). The kernels, and how they tile and
// divide the work, are in flash_attention_kernels.cuh, which the CPU emulation test
// (tests/kernels/flash_emulated_test.cpp) compiles too. Opt-in (attention.cu selects it);
// docs/cuda.md, "Fused attention".
#include <cmath>
#include <cstddef>
#include <string>

#include "kernels/cuda/context.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_kernels.cuh"

namespace mt::kernels::cuda::detail {
namespace {

template <class Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* name) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)),
             name);
}

int n_tiles(int64_t T) { return static_cast<int>((T + kTile - 1) / kTile); }

template <int HD>
void forward_hd(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                int64_t NH) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>(n_tiles(T)));
  auto* kernel = flash_forward_kernel<HD, false>;
  const size_t bytes = Dims<HD>::kForwardBytes;
  allow_shared(kernel, bytes, "cudaFuncSetAttribute (flash_forward_kernel)");
  kernel<<<grid, kFlashThreads, bytes, stream()>>>(out, lse, nullptr, nullptr, nullptr, qkv,
                                                   static_cast<int>(T), static_cast<int>(NH), C,
                                                   scale);
  check_launch("flash_forward_kernel");
}

template <int HD>
void backward_hd(float* dqkv, float* d_rows, const float* dout, const float* qkv, const float* lse,
                 int64_t B, int64_t T, int64_t C, int64_t NH) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const dim3 grid(static_cast<unsigned>(B * NH), static_cast<unsigned>(n_tiles(T)));
  const int t = static_cast<int>(T), nh = static_cast<int>(NH);

  auto* rows = flash_forward_kernel<HD, true>;
  allow_shared(rows, Dims<HD>::kForwardBytes, "cudaFuncSetAttribute (flash_backward_rows)");
  rows<<<grid, kFlashThreads, Dims<HD>::kForwardBytes, stream()>>>(nullptr, nullptr, d_rows, lse,
                                                                  dout, qkv, t, nh, C, scale);
  check_launch("flash_forward_kernel (backward rows)");

  auto* kv = flash_backward_kv_kernel<HD>;
  allow_shared(kv, Dims<HD>::kKvBytes, "cudaFuncSetAttribute (flash_backward_kv_kernel)");
  kv<<<grid, kFlashThreads, Dims<HD>::kKvBytes, stream()>>>(dqkv, dout, qkv, lse, d_rows, t, nh,
                                                           C, scale);
  check_launch("flash_backward_kv_kernel");

  auto* q = flash_backward_q_kernel<HD>;
  allow_shared(q, Dims<HD>::kQBytes, "cudaFuncSetAttribute (flash_backward_q_kernel)");
  q<<<grid, kFlashThreads, Dims<HD>::kQBytes, stream()>>>(dqkv, dout, qkv, lse, d_rows, t, nh, C,
                                                         scale);
  check_launch("flash_backward_q_kernel");
}

void check_flash_shape(const char* what, int64_t T, int64_t C, int64_t NH) {
  const int64_t hd = C / NH;
  if (!flash_attention_supports_head_dim(hd))
    fail_input(std::string(what) + ": head dim " + str(hd) + " (C=" + str(C) + ", NH=" + str(NH) +
               ") is not one of the fused kernel's 32, 64, 128 (use --attention naive for the "
               "plain attention)");
  if (T > flash_attention_max_T())
    fail_input(std::string(what) + ": T=" + str(T) + " exceeds the fused kernel's " +
               str(flash_attention_max_T()));
}

}  // namespace

bool flash_attention_supports_head_dim(int64_t hd) { return hd == 32 || hd == 64 || hd == 128; }

int64_t flash_attention_max_T() { return int64_t{kMaxTiles} * kTile; }

void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                             int64_t C, int64_t NH) {
  check_flash_shape("flash_attention_forward", T, C, NH);
  if (B == 0) return;
  switch (C / NH) {
    case 32: return forward_hd<32>(out, lse, qkv, B, T, C, NH);
    case 64: return forward_hd<64>(out, lse, qkv, B, T, C, NH);
    default: return forward_hd<128>(out, lse, qkv, B, T, C, NH);
  }
}

void flash_attention_backward(float* dqkv, float* d_rows, const float* dout, const float* qkv,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  check_flash_shape("flash_attention_backward", T, C, NH);
  if (B == 0) return;
  switch (C / NH) {
    case 32: return backward_hd<32>(dqkv, d_rows, dout, qkv, lse, B, T, C, NH);
    case 64: return backward_hd<64>(dqkv, d_rows, dout, qkv, lse, B, T, C, NH);
    default: return backward_hd<128>(dqkv, d_rows, dout, qkv, lse, B, T, C, NH);
  }
}

}  // namespace mt::kernels::cuda::detail
