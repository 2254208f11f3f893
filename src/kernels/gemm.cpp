// GEMM through oneDNN. f32 non-batched goes through dnnl_sgemm (no primitive to build, and
// measured as fast as the matmul primitive: bench/results/gemm.md); bf16 and batched GEMMs
// go through the matmul primitive, cached per calling thread by everything that defines
// it, so the steady state builds nothing and only swaps data pointers.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "core/error.h"
#include "kernels/bf16_packed.h"
#include "kernels/dispatch.h"
#include "kernels/gemm_internal.h"
#include "kernels/kernels.h"

namespace mt::kernels {
namespace {

struct MatmulKey {
  int64_t b1, b2, M, N, K;
  int64_t a[4], b[4], c[4];  // strides (batch1, batch2, row, col) of op(A), op(B), C
  float alpha, beta;
  int32_t threads;
  uint8_t bf;        // A and B in bf16 (else f32)
  uint8_t c_bf;      // C in bf16 (else f32)
  uint8_t bias;      // a bias[N] (f32) added to every row (non-batched only)
  uint8_t residual;  // an f32 [M, N] (C's strides) added after the bias (non-batched only)
  bool operator==(const MatmulKey& o) const { return std::memcmp(this, &o, sizeof(*this)) == 0; }
};

struct KeyHash {
  size_t operator()(const MatmulKey& k) const {
    // FNV-1a over the key's bytes (the struct has no uninitialised padding).
    const auto* p = reinterpret_cast<const unsigned char*>(&k);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(k); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct MatmulEntry {
  dnnl::matmul prim;
  dnnl::memory a, b, c, bias, residual;
  int residual_post_op = 0;  // its index among the post-ops
};

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// One cache and stream per thread: each rank thread builds and runs its own primitives
// (primitives also bake in the thread count at creation).
struct ThreadState {
  dnnl::stream stream{cpu_engine()};
  std::unordered_map<MatmulKey, std::unique_ptr<MatmulEntry>, KeyHash> cache;
};

ThreadState& state() {
  thread_local ThreadState s;
  return s;
}

// A memory descriptor of dims (b1, b2, rows, cols), dropping batch dims of size 1.
dnnl::memory::desc strided_md(const MatmulKey& k, int64_t rows, int64_t cols, const int64_t* st,
                              dnnl::memory::data_type dt) {
  dnnl::memory::dims dims, strides;
  if (k.b1 > 1) dims.push_back(k.b1), strides.push_back(st[0]);
  if (k.b2 > 1) dims.push_back(k.b2), strides.push_back(st[1]);
  dims.push_back(rows), strides.push_back(st[2]);
  dims.push_back(cols), strides.push_back(st[3]);
  return dnnl::memory::desc(dims, dt, strides);
}

MatmulEntry& matmul_entry(const MatmulKey& k) {
  auto& cache = state().cache;
  auto it = cache.find(k);
  if (it != cache.end()) return *it->second;
  using dt = dnnl::memory::data_type;
  const dt in_dt = k.bf ? dt::bf16 : dt::f32;
  auto a_md = strided_md(k, k.M, k.K, k.a, in_dt);
  auto b_md = strided_md(k, k.K, k.N, k.b, in_dt);
  auto c_md = strided_md(k, k.M, k.N, k.c, k.c_bf ? dt::bf16 : dt::f32);
  dnnl::memory::desc bias_md;
  if (k.bias) bias_md = dnnl::memory::desc({1, k.N}, dt::f32, dnnl::memory::format_tag::ab);
  dnnl::primitive_attr attr;
  if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
  dnnl::post_ops po;
  if (k.beta != 0.0f) po.append_sum(k.beta);
  const auto residual_md = strided_md(k, k.M, k.N, k.c, dt::f32);
  if (k.residual) po.append_binary(dnnl::algorithm::binary_add, residual_md);
  if (po.len() > 0) attr.set_post_ops(po);
  auto& eng = cpu_engine();
  dnnl::matmul::primitive_desc pd(
      k.bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md) : dnnl::matmul::desc(a_md, b_md, c_md),
      attr, eng);
  auto e = std::make_unique<MatmulEntry>();
  e->prim = dnnl::matmul(pd);
  e->a = dnnl::memory(a_md, eng, DNNL_MEMORY_NONE);
  e->b = dnnl::memory(b_md, eng, DNNL_MEMORY_NONE);
  e->c = dnnl::memory(c_md, eng, DNNL_MEMORY_NONE);
  if (k.bias) e->bias = dnnl::memory(bias_md, eng, DNNL_MEMORY_NONE);
  if (k.residual) {
    e->residual = dnnl::memory(residual_md, eng, DNNL_MEMORY_NONE);
    e->residual_post_op = k.beta != 0.0f ? 1 : 0;
  }
  return *cache.emplace(k, std::move(e)).first->second;
}

// The team a oneDNN call will get: within OMP_THREAD_LIMIT first (respect_thread_limit),
// so that the primitive is built for the threads that run it.
int dnnl_team() {
  respect_thread_limit();
  return omp_get_max_threads();
}

// Below this many multiply-adds a GEMM stays with oneDNN (the packing's fixed costs).
constexpr int64_t kMinPackedMacs = int64_t{1} << 20;

// A one-thread bf16 GEMM on the packed panels (bf16_packed.h) where they take it: on the
// CPUs that have them they beat oneDNN's on every GEMM of Model M's linears
// (bench/results/bf16-packed.md).
bool run_packed(const MatmulKey& k, const void* A, const void* B, void* C, const float* bias,
                const float* residual) {
  if (!k.bf || k.threads != 1 || k.b1 != 1 || k.b2 != 1 || k.alpha != 1.0f ||
      (k.beta != 0.0f && k.beta != 1.0f) || k.c[3] != 1 || k.M * k.N * k.K < kMinPackedMacs)
    return false;
  const packed::Operand a{static_cast<const bf16*>(A), k.a[2], k.a[3]};
  const packed::Operand b{static_cast<const bf16*>(B), k.b[2], k.b[3]};
  return packed::gemm(k.M, k.N, k.K, a, b, C, k.c[2], k.c_bf, k.beta == 1.0f, bias, residual);
}

void execute(const MatmulKey& k, const void* A, const void* B, void* C, const float* bias = nullptr,
             const float* residual = nullptr) {
  if (run_packed(k, A, B, C, bias, residual)) return;
  MatmulEntry& e = matmul_entry(k);
  e.a.set_data_handle(const_cast<void*>(A));
  e.b.set_data_handle(const_cast<void*>(B));
  e.c.set_data_handle(C);
  // The C API takes a plain array: the C++ execute() would build a hash map per call
  // (oneDNN 2.6 still builds its own inside: about 5 small news per call, freed on return).
  dnnl_exec_arg_t args[5] = {
      {DNNL_ARG_SRC, e.a.get()},
      {DNNL_ARG_WEIGHTS, e.b.get()},
      {DNNL_ARG_DST, e.c.get()},
      {DNNL_ARG_BIAS, nullptr},
      {DNNL_ARG_ATTR_MULTIPLE_POST_OP(e.residual_post_op) | DNNL_ARG_SRC_1, nullptr}};
  int nargs = 3;
  if (k.bias) {
    e.bias.set_data_handle(const_cast<float*>(bias));
    args[nargs++].memory = e.bias.get();
  }
  if (k.residual) {
    e.residual.set_data_handle(const_cast<float*>(residual));
    args[nargs] = args[4];
    args[nargs++].memory = e.residual.get();
  }
  auto& st = state().stream;
  if (dnnl_primitive_execute(e.prim.get(), st.get(), nargs, args) != dnnl_success)
    fail_run("oneDNN matmul failed (M={} N={} K={})", k.M, k.N, k.K);
  st.wait();
}

// A bf16 GEMM on a team of threads, as `team` one-thread GEMMs on column panels of C (or row
// panels where C is narrow), each thread its own primitive. oneDNN 2.6's own split of these
// shapes over 2 threads reached 74-92% of the 2-thread peak on Model M's linears (the LM
// head's worst) where the panels reached 91-101% (AMD EPYC with AVX512-BF16, 2026-11-29,
// docs/mixed_precision.md). An element is summed by one thread's kernel either way; the bits
// may differ from the whole problem's (oneDNN blocks its sums by the shape it is given) and
// do not change from run to run.
// Smaller problems keep oneDNN's own threading: a parallel region costs libgomp a team (two
// small heap blocks a call), and their time is not where a step goes.
constexpr int64_t kMinPanel = 32;
constexpr int64_t kMinSplitMacs = int64_t{1} << 24;

// MT_BF16_PANELS=0 leaves them to oneDNN's threading (for measurements).
bool panels_on() {
  static const bool v = [] {
    const char* e = std::getenv("MT_BF16_PANELS");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return v;
}

void execute_bf16(const MatmulKey& k, const void* A, const void* B, void* C, const float* bias,
                  const float* residual) {
  const bool split_n = k.N >= kMinPanel * k.threads, split_m = k.M >= kMinPanel * k.threads;
  if (!panels_on() || k.threads <= 1 || omp_in_parallel() || k.b1 != 1 || k.b2 != 1 ||
      !(split_n || split_m) || k.M * k.N * k.K < kMinSplitMacs)
    return execute(k, A, B, C, bias, residual);
  const int64_t c_elem = k.c_bf ? 2 : 4;
#pragma omp parallel num_threads(k.threads)
  {
    const int64_t team = omp_get_num_threads(), t = omp_get_thread_num();
    omp_set_num_threads(1);  // this thread's oneDNN calls: built for, and run on, one thread
    MatmulKey p = k;
    p.threads = 1;
    const auto* a = static_cast<const char*>(A);
    const auto* b = static_cast<const char*>(B);
    auto* c = static_cast<char*>(C);
    const float* bi = bias;
    const float* r = residual;
    if (split_n) {  // columns [lo, hi), panels a multiple of 16 wide
      const int64_t w = (k.N + team - 1) / team, step = (w + 15) / 16 * 16;
      const int64_t lo = std::min(k.N, t * step), hi = std::min(k.N, lo + step);
      p.N = hi - lo;
      b += 2 * lo * k.b[3], c += c_elem * lo * k.c[3];
      if (bi) bi += lo;
      if (r) r += lo * k.c[3];
    } else {  // rows [lo, hi)
      const int64_t lo = k.M * t / team, hi = k.M * (t + 1) / team;
      p.M = hi - lo;
      a += 2 * lo * k.a[2], c += c_elem * lo * k.c[2];
      if (r) r += lo * k.c[2];
    }
    if (p.M > 0 && p.N > 0) execute(p, a, b, c, bi, r);
  }
}

void check_dims(const char* what, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda,
                int64_t ldb, int64_t ldc) {
  if (M < 0 || N < 0 || K < 0) fail("{}: negative size M={} N={} K={}", what, M, N, K);
  const int64_t a_w = ta ? M : K, b_w = tb ? K : N;
  if (lda < std::max<int64_t>(1, a_w) || ldb < std::max<int64_t>(1, b_w) ||
      ldc < std::max<int64_t>(1, N))
    fail("{}: leading dims too small (lda={} needs >= {}, ldb={} needs >= {}, ldc={} needs >= {})",
         what, lda, a_w, ldb, b_w, ldc, N);
}

// C = beta*C for the degenerate K == 0 case (oneDNN refuses empty reductions).
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

void run_matmul(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                int64_t lda, int64_t sa, const void* B, int64_t ldb, int64_t sb, float beta,
                float* C, int64_t ldc, int64_t sc, int64_t batch, bool bf) {
  MatmulKey k{};
  k.b1 = batch;
  k.b2 = 1;
  k.M = M, k.N = N, k.K = K;
  // op(A)[M,K]: strides (row, col) of the stored matrix seen through the transpose.
  k.a[0] = batch > 1 ? sa : 0, k.a[1] = 0;
  k.a[2] = ta ? 1 : lda, k.a[3] = ta ? lda : 1;
  k.b[0] = batch > 1 ? sb : 0, k.b[1] = 0;
  k.b[2] = tb ? 1 : ldb, k.b[3] = tb ? ldb : 1;
  k.c[0] = batch > 1 ? sc : 0, k.c[1] = 0, k.c[2] = ldc, k.c[3] = 1;
  k.alpha = alpha, k.beta = beta;
  k.threads = dnnl_team();
  k.bf = bf;
  if (bf) return execute_bf16(k, A, B, C, nullptr, nullptr);
  execute(k, A, B, C);
}

// MT_GEMM=matmul routes f32 GEMMs through the primitive too (for measurements).
bool use_sgemm() {
  static const bool v = [] {
    const char* e = std::getenv("MT_GEMM");
    return !(e && std::strcmp(e, "matmul") == 0);
  }();
  return v;
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  MT_CUDA_DISPATCH(gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
  check_dims("gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  if (use_sgemm()) {
    respect_thread_limit();
    if (dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta,
                   C, ldc) != dnnl_success)
      fail_run("dnnl_sgemm failed (M={} N={} K={})", M, N, K);
    return;
  }
  run_matmul(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, false);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  MT_CUDA_DISPATCH(gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
  check_dims("gemm_bf16", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  run_matmul(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, true);
}

void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c,
                  int64_t batch) {
  MT_CUDA_DISPATCH(gemm_batched(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb,
                                stride_b, beta, C, ldc, stride_c, batch));
  check_dims("gemm_batched", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (batch < 0) fail("gemm_batched: negative batch {}", batch);
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < batch; ++i) scale_c(M, N, beta, C + i * stride_c, ldc);
    return;
  }
  if (batch == 1) return gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  run_matmul(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
             stride_c, batch, false);
}

namespace detail {

void matmul_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16* A,
                 int64_t lda, const bf16* B, int64_t ldb, const float* bias, float beta, void* C,
                 bool c_bf16, int64_t ldc, const float* residual) {
  check_dims("matmul_bf16", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0 || K == 0) fail("matmul_bf16: empty problem M={} N={} K={}", M, N, K);
  MatmulKey k{};
  k.b1 = 1, k.b2 = 1, k.M = M, k.N = N, k.K = K;
  k.a[2] = trans_a ? 1 : lda, k.a[3] = trans_a ? lda : 1;
  k.b[2] = trans_b ? 1 : ldb, k.b[3] = trans_b ? ldb : 1;
  k.c[2] = ldc, k.c[3] = 1;
  k.alpha = 1.0f, k.beta = beta;
  k.threads = dnnl_team();
  k.bf = 1, k.c_bf = c_bf16, k.bias = bias != nullptr, k.residual = residual != nullptr;
  execute_bf16(k, A, B, C, bias, residual);
}

void strided_matmul(int64_t b1, int64_t b2, int64_t M, int64_t N, int64_t K, float alpha,
                    const StridedView& A, const StridedView& B, float beta, float* C,
                    const int64_t c_strides[4]) {
  if (M == 0 || N == 0 || K == 0 || b1 == 0 || b2 == 0) fail("strided_matmul: empty problem");
  MatmulKey k{};
  k.b1 = b1, k.b2 = b2, k.M = M, k.N = N, k.K = K;
  for (int i = 0; i < 4; ++i) k.a[i] = A.strides[i], k.b[i] = B.strides[i], k.c[i] = c_strides[i];
  k.alpha = alpha, k.beta = beta;
  k.threads = dnnl_team();
  k.bf = 0;
  execute(k, A.ptr, B.ptr, C);
}

}  // namespace detail
}  // namespace mt::kernels
