// Where the calling rank thread computes: the CPU (default) or one CUDA GPU. Each rank
// thread chooses once, before it allocates (Tensor storage goes to the current device by
// default); the kernels of kernels.h then run on that device, on the thread's own stream.
//
// The CUDA parts exist only in a build with MESHTRAIN_CUDA (core/cuda/device_cuda.cpp);
// without it use_cuda() fails with a message saying how to build it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/memory.h"

namespace mt::device {

bool cuda_built();
// GPUs the CUDA driver sees: 0 without a CUDA build, a driver or a GPU (never throws).
int cuda_device_count();
// Free and total memory of GPU `index` (cudaMemGetInfo); false without a CUDA build, a
// driver or that GPU (never throws). The calling thread's current GPU is left as it was.
bool cuda_memory(int index, int64_t& free_bytes, int64_t& total_bytes);
// The calling thread computes on GPU `index` from now on (creates its stream). Fails,
// naming the fix, when there is no such GPU.
void use_cuda(int index = 0);
void use_cpu();
mem::Device current();
inline bool on_cuda() { return current() == mem::Device::kCuda; }
int current_index();  // the GPU of use_cuda (0 on the CPU)
// cudaStream_t of the calling thread (nullptr on the CPU). Every kernel of the thread runs
// on it, so a thread's work is ordered; the host waits only in copy() to the host and
// synchronize().
void* cuda_stream();

// Computes on the CPU until destroyed, then returns to the thread's device (to build a
// host-side model for export, say). The GPU's stream is kept.
class ScopedCpu {
 public:
  ScopedCpu();
  ~ScopedCpu();
  ScopedCpu(const ScopedCpu&) = delete;
  ScopedCpu& operator=(const ScopedCpu&) = delete;

 private:
  mem::Device device_;
  int index_;
};

// Copies `bytes` between any two devices. Returns when dst holds the data (waits for the
// thread's stream first, so earlier kernels' results are what is copied).
void copy(void* dst, mem::Device dst_device, const void* src, mem::Device src_device,
          int64_t bytes);
// Zeroes `bytes` at p (on the thread's stream for a GPU pointer: ordered with its kernels).
void zero(void* p, mem::Device d, int64_t bytes);
// Waits for every kernel the calling thread has queued.
void synchronize();
// A cudaEvent_t recorded now on the calling thread's stream (destroyed with the last
// owner; nullptr on the CPU): marks "everything this thread queued before this point", for
// work that another thread queues later (an async collective run by a group's progress
// thread must wait for exactly that, not for what the rank queued after the call).
std::shared_ptr<void> record_event();
// "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.2 GiB" (GPU `index`), or "cpu".
std::string describe(mem::Device d, int index = 0);

// Device memory for mem::allocate (cudaMalloc / cudaFree).
void* cuda_malloc(int64_t bytes);
void cuda_free(void* p);

}  // namespace mt::device
