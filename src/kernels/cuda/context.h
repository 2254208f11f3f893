// The per-thread state of the CUDA kernels: the cuBLASLt handle and its workspace, cached
// GEMM plans, reusable device scratch buffers, and small pinned host buffers. One Context per
// (thread, GPU), created on the first kernel call; buffers grow on first use and are then
// reused, so that the steady state of training allocates nothing.
//
// Included by the .cu files: no fmt here (nvcc cannot compile fmt's consteval format
// strings), so errors go through fail_input / fail_runtime (context.cpp, which throws
// mt::Error) with messages built from std::string.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>

#include "kernels/cuda/launch.h"

namespace mt::kernels::cuda::detail {

// ---- errors ------------------------------------------------------------------------------
[[noreturn]] void fail_input(const std::string& message);    // bad input (mt::fail, exit 2)
[[noreturn]] void fail_runtime(const std::string& message);  // a failure while running (exit 1)
// Throws naming `what` (the CUDA call) when e is not cudaSuccess.
void check_cuda(cudaError_t e, const char* what);
void check_cublas(cublasStatus_t s, const char* what);
// After every kernel launch: a bad launch configuration (or an earlier asynchronous fault)
// shows up here. Cheap: it does not wait for the kernel.
void check_launch(const char* kernel);

// "name: n=5 c=-1" style helpers for shape messages.
inline std::string str(int64_t v) { return std::to_string(v); }

// ---- GEMM plans (gemm.cu) ----------------------------------------------------------------
// Everything that defines a cuBLASLt matmul except the data pointers and alpha/beta.
struct GemmKey {
  int64_t M, N, K, lda, ldb, ldc, stride_a, stride_b, stride_c, batch;
  uint32_t align_a, align_b, align_c;  // bytes the data pointers are aligned to (<= 256)
  uint8_t bf16_ab;                     // A and B in bf16 (else f32); C is always f32
  uint8_t trans_a, trans_b, beta_zero;
  bool operator==(const GemmKey& o) const { return std::memcmp(this, &o, sizeof(*this)) == 0; }
};
struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    // FNV-1a over the key's bytes (every byte is set: the key is memset before filling).
    const auto* p = reinterpret_cast<const unsigned char*>(&k);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(k); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};
struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// Device scratch slots. A kernel entry point asks for each slot at most once (a later,
// larger request would free the buffer an earlier pointer still points at); different
// entry points reuse the same slots one after another on the thread's stream.
enum class Scratch : int {
  kPartials = 0,  // per-block partial sums of reductions (column sums, sum, sum_squares)
  kTemp = 1,      // an f32 GEMM result before its bf16 rounding (linear_forward_mixed)
  kSort = 2,      // keys, values and CUB temp storage of the embedding backward
  kTable = 3,     // the segment table of adamw_update_multi
  kCount = 4
};

struct Context {
  int device = -1;
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;
  size_t lt_workspace_bytes = 0;
  std::unordered_map<GemmKey, GemmPlan, GemmKeyHash> gemm_plans;
  void* scratch[static_cast<int>(Scratch::kCount)] = {};
  size_t scratch_bytes[static_cast<int>(Scratch::kCount)] = {};
  double* host_result = nullptr;  // pinned, 1 double: the value sum / sum_squares return
  void* host_staging = nullptr;   // pinned: data copied to the device asynchronously
  size_t host_staging_bytes = 0;
  cudaEvent_t staging_done = nullptr;  // recorded after the last copy out of host_staging

  Context() = default;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context();
};

// The calling thread's context for its current GPU (device::current_index()); fails when
// the thread does not compute on a GPU.
Context& context();
// The calling thread's stream (device::cuda_stream()).
cudaStream_t stream();
// A device buffer of at least `bytes` for `slot`, grown (after waiting for the stream, so
// no queued kernel still uses the old one) when too small.
void* scratch(Scratch slot, size_t bytes);
// A pinned host buffer of at least `bytes` whose previous contents have been copied out:
// waits for the copy recorded by staging_copied() (long finished in the steady state).
void* host_staging(size_t bytes);
// Records, on the stream, that the copy out of host_staging has been queued.
void staging_copied();

// ---- shape checks (the launch shapes, kThreads and grid_for: launch.h) --------------------
// Checks n >= 0 with a message naming the kernel and the size.
inline void check_nonneg(const char* what, const char* name, int64_t v) {
  if (v < 0) fail_input(std::string(what) + ": " + name + " must be >= 0, got " + str(v));
}

// ---- column sums (reduce.cu; the split is launch.h's column_chunks) ---------------------
// out[j] += sum over chunks k in order of partials[k * c + j].
void add_partials(float* out, const float* partials, int64_t chunks, int64_t c);
// out[j] += sum_i x[i * c + j] (the bias gradient of a linear layer), deterministic.
void add_column_sums(float* out, const float* x, int64_t n, int64_t c);

// ---- small shared launches ---------------------------------------------------------------
// y[i, :] += b for the n rows of [n, c] (elementwise.cu).
void launch_add_bias(float* y, const float* b, int64_t n, int64_t c);
// C[i*ldc + j] = beta * C[...] (0 when beta == 0) over M x N, `batch` matrices stride_c
// apart: a GEMM with K == 0 (gemm.cu).
void launch_scale_matrix(float* C, int64_t M, int64_t N, int64_t ldc, int64_t stride_c,
                         int64_t batch, float beta);

// dw[tokens[i] - v0, :] += dy[i, :] for every i with v0 <= tokens[i] < v0 + rows
// (embedding.cu). Deterministic and in the CPU's order: the positions are stably sorted by
// row (CUB radix sort), then one block per distinct row adds that row's dy rows to it in
// position order.
void accumulate_rows_by_token(float* dw, const float* dy, const int32_t* tokens, int64_t n,
                              int64_t C, int64_t v0, int64_t rows);

}  // namespace mt::kernels::cuda::detail
