// GEMMs through cuBLASLt, with the row-major contract of kernels.h.
//
// cuBLASLt is column-major. A row-major matrix X[r, c] with leading dim ld is, read
// column-major, X^T[c, r] with the same ld. So the row-major C[M,N] = op(A) op(B) is the
// column-major C^T[N,M] = op(B)^T op(A)^T: cuBLASLt's "A" is our B and its "B" is our A,
// each with its own transpose flag, and m = N, n = M.
//
// Precision: f32 GEMMs use CUBLAS_COMPUTE_32F with f32 A/B/C, which is true f32 arithmetic
// (TF32 would need CUBLAS_COMPUTE_32F_FAST_TF32): the CPU oracle's precision, so the two
// differ only by summation order. bf16 GEMMs read bf16 A/B and accumulate and write in f32.
//
// Plans (descriptors, layouts and the heuristic's algorithm) are cached per thread by
// everything that defines them, including the alignment of the data pointers: cuBLASLt
// assumes 256-byte aligned buffers unless told otherwise, and attention passes pointers into
// the middle of qkv.
#include <cstring>

#include "kernels/cuda/context.h"
#include "kernels/cuda/kernels_cuda.h"

namespace mt::kernels::cuda {
namespace {

using detail::check_cublas;
using detail::check_launch;
using detail::fail_input;
using detail::str;

// The largest power of two (<= 256) dividing the address and, for a batch, the stride in
// bytes: the alignment every matrix of the batch has.
uint32_t alignment(const void* p, int64_t stride_bytes) {
  uint64_t a = reinterpret_cast<uintptr_t>(p) | uint64_t{256};
  if (stride_bytes != 0) a |= static_cast<uint64_t>(stride_bytes);
  return static_cast<uint32_t>(a & (~a + 1));  // lowest set bit
}

void check_dims(const char* what, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda,
                int64_t ldb, int64_t ldc) {
  if (M < 0 || N < 0 || K < 0)
    fail_input(std::string(what) + ": negative size M=" + str(M) + " N=" + str(N) +
               " K=" + str(K));
  const int64_t a_w = ta ? M : K, b_w = tb ? K : N;
  const auto at_least_1 = [](int64_t v) { return v < 1 ? int64_t{1} : v; };
  if (lda < at_least_1(a_w) || ldb < at_least_1(b_w) || ldc < at_least_1(N))
    fail_input(std::string(what) + ": leading dims too small (lda=" + str(lda) +
               " needs >= " + str(a_w) + ", ldb=" + str(ldb) + " needs >= " + str(b_w) +
               ", ldc=" + str(ldc) + " needs >= " + str(N) + ")");
}

void set_layout_attr(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                     const void* v, size_t bytes) {
  check_cublas(cublasLtMatrixLayoutSetAttribute(l, attr, v, bytes),
               "cublasLtMatrixLayoutSetAttribute");
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_cublas(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows),
                                          static_cast<uint64_t>(cols), ld),
               "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    set_layout_attr(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count));
    set_layout_attr(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride));
  }
  return l;
}

detail::GemmPlan make_plan(const detail::GemmKey& k) {
  detail::Context& ctx = detail::context();
  detail::GemmPlan p;
  check_cublas(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  // cuBLASLt's A is our B, its B our A (see the top of the file).
  const cublasOperation_t op_a = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
               "cublasLtMatmulDescSetAttribute (TRANSA)");
  check_cublas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
               "cublasLtMatmulDescSetAttribute (TRANSB)");
  const cudaDataType_t ab = k.bf16_ab ? CUDA_R_16BF : CUDA_R_32F;
  // Stored shapes (before the op), column-major: our B is [N, K] (or [K, N] transposed),
  // our A is [K, M] (or [M, K]), C is [N, M].
  p.a = make_layout(ab, k.trans_b ? k.K : k.N, k.trans_b ? k.N : k.K, k.ldb, k.batch, k.stride_b);
  p.b = make_layout(ab, k.trans_a ? k.M : k.K, k.trans_a ? k.K : k.M, k.lda, k.batch, k.stride_a);
  p.c = make_layout(CUDA_R_32F, k.N, k.M, k.ldc, k.batch, k.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = ctx.lt_workspace_bytes;
  const auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* v, size_t n) {
    check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, attr, v, n),
                 "cublasLtMatmulPreferenceSetAttribute");
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  // Swapped like the operands: cuBLASLt's A is our B.
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k.align_b, sizeof(k.align_b));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k.align_a, sizeof(k.align_a));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k.align_c, sizeof(k.align_c));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k.align_c, sizeof(k.align_c));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(ctx.lt, p.op, p.a, p.b, p.c, p.c, pref,
                                                          1, &result, &found);
  (void)cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
    (void)cublasLtMatrixLayoutDestroy(p.a);
    (void)cublasLtMatrixLayoutDestroy(p.b);
    (void)cublasLtMatrixLayoutDestroy(p.c);
    (void)cublasLtMatmulDescDestroy(p.op);
    detail::fail_runtime(
        std::string("cuBLASLt: cublasLtMatmulAlgoGetHeuristic found no algorithm (") +
        cublasLtGetStatusName(s) + ") for " + (k.bf16_ab ? "bf16" : "f32") +
        " M=" + str(k.M) + " N=" + str(k.N) + " K=" + str(k.K) + " trans_a=" + str(k.trans_a) +
        " trans_b=" + str(k.trans_b) + " lda=" + str(k.lda) + " ldb=" + str(k.ldb) +
        " ldc=" + str(k.ldc) + " batch=" + str(k.batch) + " align(A,B,C)=" + str(k.align_a) +
        "," + str(k.align_b) + "," + str(k.align_c));
  }
  p.algo = result.algo;
  return p;
}

// C = alpha * op(A) op(B) + beta * C for `batch` matrices; sizes already checked.
void run(bool bf16_ab, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
         const void* A, int64_t lda, int64_t sa, const void* B, int64_t ldb, int64_t sb,
         float beta, float* C, int64_t ldc, int64_t sc, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0) return detail::launch_scale_matrix(C, M, N, ldc, sc, batch, beta);
  const int64_t esize = bf16_ab ? 2 : 4;
  detail::GemmKey k;
  std::memset(&k, 0, sizeof(k));
  k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc;
  k.batch = batch;
  k.stride_a = batch > 1 ? sa : 0, k.stride_b = batch > 1 ? sb : 0, k.stride_c = batch > 1 ? sc : 0;
  k.align_a = alignment(A, k.stride_a * esize);
  k.align_b = alignment(B, k.stride_b * esize);
  k.align_c = alignment(C, k.stride_c * 4);
  k.bf16_ab = bf16_ab, k.trans_a = ta, k.trans_b = tb, k.beta_zero = beta == 0.0f;
  detail::Context& ctx = detail::context();
  auto it = ctx.gemm_plans.find(k);
  if (it == ctx.gemm_plans.end()) it = ctx.gemm_plans.emplace(k, make_plan(k)).first;
  const detail::GemmPlan& p = it->second;
  check_cublas(cublasLtMatmul(ctx.lt, p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo,
                              ctx.lt_workspace, ctx.lt_workspace_bytes, detail::stream()),
               "cublasLtMatmul");
}

__global__ void scale_matrix_kernel(float* C, int64_t M, int64_t N, int64_t ldc, int64_t stride_c,
                                    int64_t batch, float beta) {
  const int64_t total = batch * M * N;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = i / (M * N), r = (i / N) % M, c = i % N;
    float& x = C[b * stride_c + r * ldc + c];
    x = beta == 0.0f ? 0.0f : beta * x;
  }
}

}  // namespace

void detail::launch_scale_matrix(float* C, int64_t M, int64_t N, int64_t ldc, int64_t stride_c,
                                 int64_t batch, float beta) {
  const int64_t total = batch * M * N;
  if (total == 0) return;
  scale_matrix_kernel<<<grid_for(total), kThreads, 0, stream()>>>(C, M, N, ldc, stride_c, batch,
                                                                   beta);
  check_launch("scale_matrix_kernel");
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_dims("gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  run(false, trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  check_dims("gemm_bf16", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  run(true, trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c,
                  int64_t batch) {
  check_dims("gemm_batched", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (batch < 0) fail_input("gemm_batched: negative batch " + str(batch));
  if (batch > INT32_MAX) fail_input("gemm_batched: batch " + str(batch) + " exceeds 2^31-1");
  run(false, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
      stride_c, batch);
}

}  // namespace mt::kernels::cuda
