#include "kernels/cuda/context.h"

#include <map>

#include "core/device.h"
#include "core/error.h"

namespace mt::kernels::cuda::detail {
namespace {

constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's recommendation on Hopper

// One context per GPU the thread has computed on (a rank thread uses one).
thread_local std::map<int, std::unique_ptr<Context>> t_contexts;

std::unique_ptr<Context> make_context(int index) {
  auto c = std::make_unique<Context>();
  c->device = index;
  check_cublas(cublasLtCreate(&c->lt), "cublasLtCreate");
  check_cuda(cudaMalloc(&c->lt_workspace, kLtWorkspaceBytes), "cudaMalloc (cuBLASLt workspace)");
  c->lt_workspace_bytes = kLtWorkspaceBytes;
  check_cuda(cudaMallocHost(reinterpret_cast<void**>(&c->host_result), sizeof(double)),
             "cudaMallocHost (result)");
  check_cuda(cudaEventCreateWithFlags(&c->staging_done, cudaEventDisableTiming),
             "cudaEventCreate (staging)");
  return c;
}

}  // namespace

void fail_input(const std::string& message) { fail("{}", message); }
void fail_runtime(const std::string& message) { fail_run("{}", message); }

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fail_run("CUDA: {} failed: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail_run("cuBLASLt: {} failed: {} ({})", what, cublasLtGetStatusString(s),
             cublasLtGetStatusName(s));
}

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail_run("CUDA: launch of kernel {} failed: {} ({})", kernel, cudaGetErrorString(e),
             cudaGetErrorName(e));
}

// Frees what the context holds; errors are ignored (at process exit the driver may be
// shutting down already, and there is nobody left to report to).
Context::~Context() {
  for (auto& [key, plan] : gemm_plans) {
    (void)cublasLtMatrixLayoutDestroy(plan.a);
    (void)cublasLtMatrixLayoutDestroy(plan.b);
    (void)cublasLtMatrixLayoutDestroy(plan.c);
    (void)cublasLtMatmulDescDestroy(plan.op);
  }
  if (lt) (void)cublasLtDestroy(lt);
  if (lt_workspace) (void)cudaFree(lt_workspace);
  for (void* p : scratch)
    if (p) (void)cudaFree(p);
  if (host_result) (void)cudaFreeHost(host_result);
  if (host_staging) (void)cudaFreeHost(host_staging);
  if (staging_done) (void)cudaEventDestroy(staging_done);
}

Context& context() {
  if (!device::on_cuda())
    fail_run("internal error: a CUDA kernel was called on a thread that computes on the CPU "
             "(call device::use_cuda first)");
  const int index = device::current_index();
  auto& slot = t_contexts[index];
  if (!slot) slot = make_context(index);
  return *slot;
}

cudaStream_t stream() { return static_cast<cudaStream_t>(device::cuda_stream()); }

void* scratch(Scratch which, size_t bytes) {
  Context& c = context();
  const int s = static_cast<int>(which);
  if (bytes == 0) bytes = 1;
  if (c.scratch_bytes[s] < bytes) {
    if (c.scratch[s]) {
      // Kernels queued earlier may still read or write the old buffer.
      check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (scratch growth)");
      check_cuda(cudaFree(c.scratch[s]), "cudaFree (scratch)");
      c.scratch[s] = nullptr;
      c.scratch_bytes[s] = 0;
    }
    // A little headroom, so that slowly growing requests do not reallocate every time.
    const size_t grown = bytes + bytes / 4;
    c.scratch[s] = device::cuda_malloc(static_cast<int64_t>(grown));
    c.scratch_bytes[s] = grown;
  }
  return c.scratch[s];
}

void* host_staging(size_t bytes) {
  Context& c = context();
  // The last asynchronous copy out of the buffer must be done before it is overwritten.
  check_cuda(cudaEventSynchronize(c.staging_done), "cudaEventSynchronize (staging)");
  if (c.host_staging_bytes < bytes) {
    if (c.host_staging) check_cuda(cudaFreeHost(c.host_staging), "cudaFreeHost (staging)");
    c.host_staging = nullptr;
    c.host_staging_bytes = 0;
    const size_t grown = bytes + bytes / 4;
    check_cuda(cudaMallocHost(&c.host_staging, grown), "cudaMallocHost (staging)");
    c.host_staging_bytes = grown;
  }
  return c.host_staging;
}

void staging_copied() {
  check_cuda(cudaEventRecord(context().staging_done, stream()), "cudaEventRecord (staging)");
}

}  // namespace mt::kernels::cuda::detail
