// Fused causal attention (flash-attention-2 style) on bf16 tensor cores: the path of
// attention.cu when the thread has it on (--attention; the default for bf16 on a GPU). Same
// layouts as kernels.h's attention (qkv [B, T, 3C], out [B, T, C], dqkv overwritten); what
// it keeps between forward and backward is the per-row log-sum-exp, B*NH*T floats, and
// backward's scratch is B*NH*T floats too (D, the row sums of dO * O). See docs/cuda.md,
// "Fused attention".
#pragma once

#include <cstdint>

namespace mt::kernels::cuda::detail {

// The head dims the fused kernels are instantiated for (32, 64, 128).
bool flash_attention_supports_head_dim(int64_t hd);
// The largest T the fused kernels launch for (query tiles on the grid's y axis).
int64_t flash_attention_max_T();

// lse [B*NH*T]: logsumexp over keys 0..t of the scaled scores of row (b, h, t).
void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                             int64_t C, int64_t NH);
// d_rows [B*NH*T]: scratch (overwritten with D = rowsum(dO * O)).
void flash_attention_backward(float* dqkv, float* d_rows, const float* dout, const float* qkv,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH);

}  // namespace mt::kernels::cuda::detail
