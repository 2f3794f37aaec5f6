// A 32-bit counter in page-locked host memory that CUDA streams wait on and write without the
// host: wait() stalls a stream until a host thread's set() (or a stream's write()) reaches a value.
// These are stream memory operations (cuStreamWaitValue32 / cuStreamWriteValue32), reached
// through the runtime's driver entry points so nothing links libcuda; on the H200 host they cost
// ~2 µs beyond a kernel launch, where a host synchronisation per MoE layer costs a round trip.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace moe::gpu {

class StreamFlag {
 public:
  // How a stream waits: a stream memory operation, or a one-thread kernel polling the counter.
  // HostOnly: plain host memory and no CUDA call at all; no stream can wait on it (the host side
  // of a hand-off, tested on machines without a GPU).
  enum class Waiter { MemOp, Kernel, HostOnly };

  // Allocates the counter (0). With MemOp, checks that the device honours a wait on it; when it
  // does not (old driver, no stream memory operations), supported() is false and refusal() says
  // why.
  explicit StreamFlag(Waiter waiter = Waiter::Kernel);
  ~StreamFlag();
  StreamFlag(const StreamFlag&) = delete;
  StreamFlag& operator=(const StreamFlag&) = delete;

  bool supported() const {
    return waiter_ == Waiter::Kernel || (waiter_ == Waiter::MemOp && wait_fn_ != nullptr);
  }
  const std::string& refusal() const { return refusal_; }

  // Enqueues on `stream`: continue once the counter has reached `value` (cyclic comparison, so
  // wrap-around is harmless).
  void wait(cudaStream_t stream, uint32_t value) const;
  // Enqueues on `stream`: store `value` into the counter once the work before it is done (needs
  // stream memory operations whatever the waiter).
  void write(cudaStream_t stream, uint32_t value) const;
  // Host side: store / load with release / acquire ordering (the data the value announces is
  // visible to whoever observes it).
  void set(uint32_t value);
  uint32_t get() const;

 private:
  using WaitFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  Waiter waiter_;
  uint32_t* host_ = nullptr;
  CUdeviceptr dev_ = 0;
  WaitFn wait_fn_ = nullptr;
  WaitFn write_fn_ = nullptr;
  std::string refusal_;
};

}  // namespace moe::gpu
