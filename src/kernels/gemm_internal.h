// A GEMM over a two-level batch with arbitrary strides, for kernels that multiply views
// into a larger tensor (attention: (batch, head) blocks of qkv). Not part of the public
// interface.
#pragma once

#include <cstdint>

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

}  // namespace mt::kernels::detail
