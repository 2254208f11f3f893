// A GEMM over a two-level batch with arbitrary strides, for kernels that multiply views
// into a larger tensor (attention: (batch, head) blocks of qkv). Not part of the public
// interface.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mt::kernels::detail {

// Element (i1, i2, r, c) of the operand is ptr[i1*s[0] + i2*s[1] + r*s[2] + c*s[3]]; the
// operand is already op(X) (a transpose is a swap of s[2] and s[3]).
struct StridedView {
  const float* ptr;
  int64_t strides[4];
};

// C[i1, i2] = alpha * A[i1, i2] (MxK) * B[i1, i2] (KxN) + beta * C[i1, i2], f32, through a
// cached oneDNN matmul primitive (the whole batch in one call, threaded inside).
void strided_matmul(int64_t b1, int64_t b2, int64_t M, int64_t N, int64_t K, float alpha,
                    const StridedView& A, const StridedView& B, float beta, float* C,
                    const int64_t c_strides[4]);

// C[M,N] = op(A)[M,K] * op(B)[K,N] + bias[N] + beta * C + residual: bf16 A and B, f32
// accumulation, bias f32 (may be null, fused into the primitive), residual f32 [M, N] with
// C's row stride (may be null; the primitive's binary post-op, added after the bias), C f32
// or (c_bf16) bf16, rounded once from the f32 result. Non-batched, no empty dimension.
// Cached like gemm_bf16.
void matmul_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16* A,
                 int64_t lda, const bf16* B, int64_t ldb, const float* bias, float beta, void* C,
                 bool c_bf16, int64_t ldc, const float* residual = nullptr);

// Column sums of dy[n, out] added to db (the bias gradient of a linear layer). Threads
// split the columns, and each column is summed over rows in order, so the bits do not
// depend on the thread count. Shared by the f32 and the mixed-precision linear.
void bias_grad(float* db, const float* dy, int64_t n, int64_t out);

}  // namespace mt::kernels::detail
