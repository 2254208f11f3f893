// Vocabulary of the communication layer: operations, reductions, buffers, one call as a
// backend sees it, and the Work handle of an asynchronous call (after PyTorch c10d's
// Backend/Work split). Nothing here assumes host memory: a buffer is (pointer, element
// count, dtype, device), so a GPU backend can take the same calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/memory.h"
#include "core/tensor.h"

namespace mt::comm {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax };

enum class OpType : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kSend,
  kRecv,
  kAllToAll,
  kBarrier,
  kSplit,
};
constexpr int kNumOpTypes = 9;
std::string_view op_name(OpType op);
std::string_view reduce_name(ReduceOp op);

// A contiguous buffer of `elems` elements of `dtype` on `device`.
struct Buf {
  void* ptr = nullptr;
  int64_t elems = 0;
  DType dtype = DType::kF32;
  mem::Device device = mem::Device::kCpu;

  Buf() = default;
  Buf(void* p, int64_t n, DType t, mem::Device d = mem::Device::kCpu)
      : ptr(p), elems(n), dtype(t), device(d) {}
  Buf(float* p, int64_t n) : ptr(p), elems(n), dtype(DType::kF32) {}
  Buf(bf16* p, int64_t n) : ptr(p), elems(n), dtype(DType::kBF16) {}
  Buf(const Tensor& t)  // NOLINT: a tensor is a buffer
      : ptr(t.defined() ? t.raw() : nullptr),
        elems(t.numel()),
        dtype(t.dtype()),
        device(t.device()) {}
  int64_t bytes() const { return elems * dtype_bytes(dtype); }
};

// A buffer of the calling thread's device (core/device.h): what a raw pointer into a
// model tensor is (the tensors of a rank live on its device).
inline Buf device_buf(float* p, int64_t n) { return Buf(p, n, DType::kF32, device::current()); }

// One operation as a backend executes it. Element counts, not bytes.
struct OpCall {
  OpType op = OpType::kBarrier;
  ReduceOp reduce = ReduceOp::kSum;
  DType dtype = DType::kF32;
  mem::Device device = mem::Device::kCpu;
  const void* in = nullptr;
  void* out = nullptr;
  int64_t in_elems = 0;
  int64_t out_elems = 0;
  // all_gather / reduce_scatter: elements of each rank's piece (size() entries);
  // all_to_all: elements this rank sends to each rank.
  std::vector<int64_t> counts;
  std::vector<int64_t> recv_counts;  // all_to_all: elements this rank receives from each rank
  bool equal_pieces = false;  // all_gather / reduce_scatter / all_to_all called without counts
  int peer = -1;              // broadcast: root; send/recv: the other rank (group rank)
  int tag = 0;
  int64_t seq = 0;  // per group (collectives) or per (peer, direction) (send/recv)
  // The device and CUDA stream (a cudaStream_t) of the thread that made the call, captured
  // when it was made: an async op runs later on the group's progress thread, but must be
  // ordered after the kernels the issuing rank queued before the call (and, on the nccl
  // backend, its result before the rank's later kernels). -1 / nullptr on the CPU.
  int cuda_device = -1;
  void* cuda_stream = nullptr;
  // An async op's cudaEvent_t, recorded on cuda_stream when the call was made (nullptr for
  // a blocking one, which runs while its caller waits): the op waits for it, not for a
  // point of the stream the rank reached by the time the progress thread ran it. A later
  // point would order the op after the rank's next collectives on other groups on one
  // rank and before them on another: a cycle of waits across ranks (nccl).
  std::shared_ptr<void> cuda_ready;
  // Started async by its caller (the same on every rank: the ranks run the same code), so
  // it runs on the group's progress thread while the caller goes on, and the backend may
  // wait for it patiently (comm/mpi.cpp: yielding the core instead of polling it). A
  // blocking op queued behind an async one stays blocking: a rank with nothing queued runs
  // it on its own thread, and MPI matches a blocking collective only with a blocking one.
  bool async = false;
  // Filled in by the backend: bytes this rank moved, counted as the ring algorithm moves
  // them (docs/comm.md).
  int64_t sent_bytes = 0;
  int64_t recv_bytes = 0;
};

// The handle of an asynchronous operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation is done; throws mt::Error if it failed or the job aborted.
  virtual void wait() = 0;
  // True once done (throws like wait() if it failed); never blocks.
  virtual bool test() = 0;
  // Like test(), but never starts anything still held back: the nccl backend issues its
  // pending send/recv as one group at the first test or wait, and a poll to see whether a
  // buffer is free must not cut an exchange in two (a send waits for its receive there).
  virtual bool poll() { return test(); }
};
using WorkPtr = std::shared_ptr<Work>;

}  // namespace mt::comm
