#include "comm/staging.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

#if MESHTRAIN_CUDA
#include <cuda_runtime.h>
#endif

namespace mt::comm {

void copy_for_call(const OpCall& c, void* dst, mem::Device dst_device, const void* src,
                   mem::Device src_device, int64_t bytes) {
  if (bytes <= 0) return;
#if MESHTRAIN_CUDA
  auto check = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      fail_run("CUDA: {} failed while staging a collective through host memory: {} ({})", what,
               cudaGetErrorString(e), cudaGetErrorName(e));
  };
  // The progress thread of a group is not the rank's thread: select the rank's device.
  if (c.cuda_device >= 0) check(cudaSetDevice(c.cuda_device), "cudaSetDevice");
  auto stream = static_cast<cudaStream_t>(c.cuda_stream);
  const cudaMemcpyKind kind =
      dst_device == mem::Device::kCuda
          ? (src_device == mem::Device::kCuda ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
          : (src_device == mem::Device::kCuda ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
#else
  (void)c, (void)dst, (void)dst_device, (void)src, (void)src_device;
  fail("a communication buffer is on a GPU, but this meshtrain was built without CUDA");
#endif
}

HostStaging::~HostStaging() {
  mem::release(a_);
  mem::release(b_);
}

char* HostStaging::grow(mem::Block& blk, int64_t bytes) {
  if (blk.bytes < bytes) {
    mem::release(blk);
    mem::ScopedTracker scope(tracker_);
    blk = mem::allocate(bytes, mem::Category::kCommunication, mem::Device::kCpu);
  }
  return static_cast<char*>(blk.ptr);
}

void HostStaging::run(Backend& b, OpCall& c) {
  const mem::Device kGpu = mem::Device::kCuda, kHost = mem::Device::kCpu;
  const int64_t es = dtype_bytes(c.dtype);
  auto* in = static_cast<const char*>(c.in);
  auto* out = static_cast<char*>(c.out);
  const int64_t in_bytes = in ? c.in_elems * es : 0;
  const int64_t out_bytes = out ? c.out_elems * es : 0;
  // In place (all_reduce), out inside in (reduce_scatter) or in inside out (all_gather):
  // stage the span they cover as one buffer, so the aliasing is the same on the host.
  const bool overlap = in_bytes > 0 && out_bytes > 0 && in < out + out_bytes && out < in + in_bytes;
  const char* lo = nullptr;
  int64_t span = 0;
  char* host_in = nullptr;
  char* host_out = nullptr;
  if (overlap) {
    lo = std::min<const char*>(in, out);
    const char* hi = std::max<const char*>(in + in_bytes, out + out_bytes);
    span = hi - lo;
    char* h = grow(a_, span);
    copy_for_call(c, h, kHost, lo, kGpu, span);
    host_in = h + (in - lo);
    host_out = h + (out - lo);
  } else {
    if (in_bytes > 0) {
      host_in = grow(a_, in_bytes);
      copy_for_call(c, host_in, kHost, in, kGpu, in_bytes);
    }
    if (out_bytes > 0) host_out = grow(b_, out_bytes);  // every op writes all of its output
  }
  struct Restore {  // the call as the caller made it, whatever happens
    OpCall& c;
    const void* in;
    void* out;
    ~Restore() {
      c.in = in;
      c.out = out;
      c.device = mem::Device::kCuda;
    }
  } restore{c, c.in, c.out};
  static char empty[64];  // a valid pointer for an empty piece (nothing is read or written)
  c.in = in ? (host_in ? host_in : empty) : nullptr;
  c.out = out ? (host_out ? host_out : empty) : nullptr;
  c.device = kHost;
  b.run(c);
  if (overlap)
    copy_for_call(c, const_cast<char*>(lo), kGpu, host_in - (in - lo), kHost, span);
  else if (out_bytes > 0)
    copy_for_call(c, out, kGpu, host_out, kHost, out_bytes);
}

namespace {
// A send or recv of a GPU buffer on a host backend, run through a host copy: the send's
// copy is made before it starts; the recv's lands on the GPU in wait()/test(), on the rank
// thread that waits (its device and stream). The host copy lives as long as the op.
class StagedP2pWork : public Work {
 public:
  StagedP2pWork(WorkPtr inner, std::shared_ptr<std::vector<char>> host, OpCall dev_call)
      : inner_(std::move(inner)), host_(std::move(host)), call_(std::move(dev_call)) {}
  void wait() override {
    inner_->wait();
    land();
  }
  bool test() override {
    if (!inner_->test()) return false;
    land();
    return true;
  }

 private:
  void land() {
    if (landed_ || call_.op != OpType::kRecv) return;
    copy_for_call(call_, call_.out, mem::Device::kCuda, host_->data(), mem::Device::kCpu,
                  call_.out_elems * dtype_bytes(call_.dtype));
    landed_ = true;
  }
  WorkPtr inner_;
  std::shared_ptr<std::vector<char>> host_;
  OpCall call_;
  bool landed_ = false;
};
}  // namespace

// A host vector per op: this path exists for correctness runs on one GPU, not for speed
// (NCCL is the fast path).
WorkPtr staged_p2p(std::shared_ptr<OpCall> call,
                   const std::function<WorkPtr(std::shared_ptr<OpCall>)>& submit) {
  const bool send = call->op == OpType::kSend;
  const int64_t bytes = (send ? call->in_elems : call->out_elems) * dtype_bytes(call->dtype);
  auto host = std::make_shared<std::vector<char>>(static_cast<size_t>(bytes));
  const OpCall dev_call = *call;
  if (send) {
    copy_for_call(*call, host->data(), mem::Device::kCpu, call->in, mem::Device::kCuda, bytes);
    call->in = host->data();
  } else {
    call->out = host->data();
  }
  call->device = mem::Device::kCpu;
  WorkPtr inner = submit(std::move(call));
  return std::make_shared<StagedP2pWork>(std::move(inner), std::move(host), dev_call);
}

}  // namespace mt::comm
