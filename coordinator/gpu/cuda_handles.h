// Owning handles for a CUDA stream and event, so members release them on every exit path.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {

class CudaStream {
 public:
  CudaStream() { MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~CudaStream() { (void)cudaStreamDestroy(s_); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class CudaEvent {
 public:
  // `timing`: the event can be measured with cudaEventElapsedTime (recording costs a little more).
  explicit CudaEvent(bool timing = false) {
    MOE_CUDA_CHECK(
        cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaEvent() { (void)cudaEventDestroy(e_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace moe::gpu
