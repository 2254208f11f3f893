// Device buffers on the host backends (local, mpi): a collective whose buffers are on a GPU
// is run by copying its input to host memory, running the host algorithm there and copying
// the output back, on the stream of the rank thread that made the call (OpCall::cuda_stream,
// captured at call time: the copy sees the kernels that produced the input, even when the op
// runs later on the group's progress thread). Slow, exact (the same bits as host buffers),
// and what lets several rank threads share one GPU (`--backend local --device cuda`), which
// NCCL refuses. The byte counters stay those of the op.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "comm/group.h"
#include "core/memory.h"

namespace mt::comm {

// Copies `bytes` between host and device (either way) on the stream the call was made on,
// and waits for it. Fails with a message in a build without CUDA.
void copy_for_call(const OpCall& c, void* dst, mem::Device dst_device, const void* src,
                   mem::Device src_device, int64_t bytes);

// The staging buffers of one group (ops of a group never run at once, so one pair serves
// them all). Grown only when an op needs more: the steady state allocates nothing.
class HostStaging {
 public:
  // The buffers count against `tracker` (the group's: it outlives the group).
  explicit HostStaging(mem::Tracker& tracker) : tracker_(tracker) {}
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  // Runs `c` (device buffers) on the host backend `b`; `c` is the same afterwards except for
  // its byte counts.
  void run(Backend& b, OpCall& c);

 private:
  char* grow(mem::Block& blk, int64_t bytes);
  mem::Tracker& tracker_;
  mem::Block a_, b_;
};

// Send/recv of a GPU buffer on a host backend (several rank threads sharing one GPU
// exchange pipeline activations this way): the send's host copy is made before `submit`
// starts the host op; the recv's data lands on the GPU in the returned Work's wait()/test(),
// on the rank thread that waits (its device and stream). The host copy lives as long as
// the op.
WorkPtr staged_p2p(std::shared_ptr<OpCall> call,
                   const std::function<WorkPtr(std::shared_ptr<OpCall>)>& submit);

}  // namespace mt::comm
