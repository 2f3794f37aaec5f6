#include "coordinator/gpu/stream_flag.h"

#include <atomic>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/driver_api.h"
#include "kernels/cuda/host_flag.h"

namespace moe::gpu {

using cuda::driver_error;
using cuda::driver_function;

StreamFlag::StreamFlag(Waiter waiter) : waiter_(waiter) {
  if (waiter == Waiter::HostOnly) {
    host_ = new uint32_t(0);
    refusal_ = "a host-only flag";
    return;
  }
  void* p = nullptr;
  MOE_CUDA_CHECK(cudaHostAlloc(&p, sizeof(uint32_t), cudaHostAllocMapped));
  host_ = static_cast<uint32_t*>(p);
  *host_ = 0;
  void* d = nullptr;
  MOE_CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
  dev_ = reinterpret_cast<CUdeviceptr>(d);

  WaitFn wait = driver_function<WaitFn>("cuStreamWaitValue32", refusal_);
  WaitFn write = wait ? driver_function<WaitFn>("cuStreamWriteValue32", refusal_) : nullptr;
  if (!wait || !write) return;
  // A wait that is already satisfied must pass: devices without stream memory operations refuse
  // the call (CUDA_ERROR_NOT_SUPPORTED) instead.
  cudaStream_t s = nullptr;
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const CUresult rc = wait(s, dev_, 0, CU_STREAM_WAIT_VALUE_GEQ);
  const cudaError_t sync = cudaStreamSynchronize(s);
  (void)cudaStreamDestroy(s);
  MOE_CUDA_CHECK(sync);
  if (rc != CUDA_SUCCESS) {
    refusal_ = driver_error("cuStreamWaitValue32", rc);
    return;
  }
  wait_fn_ = wait;
  write_fn_ = write;
}

StreamFlag::~StreamFlag() {
  if (waiter_ == Waiter::HostOnly) {
    delete host_;
  } else if (host_) {
    (void)cudaFreeHost(host_);
  }
}

void StreamFlag::wait(cudaStream_t stream, uint32_t value) const {
  if (waiter_ == Waiter::HostOnly) throw Error("StreamFlag::wait: " + refusal_);
  if (waiter_ == Waiter::Kernel) {
    cuda::wait_host_flag(reinterpret_cast<const uint32_t*>(dev_), value, stream);
    return;
  }
  if (!wait_fn_) throw Error("StreamFlag::wait: " + refusal_);
  const CUresult rc = wait_fn_(stream, dev_, value, CU_STREAM_WAIT_VALUE_GEQ);
  if (rc != CUDA_SUCCESS) throw Error(driver_error("cuStreamWaitValue32", rc));
}

void StreamFlag::write(cudaStream_t stream, uint32_t value) const {
  if (!write_fn_) throw Error("StreamFlag::write: " + refusal_);
  const CUresult rc = write_fn_(stream, dev_, value, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (rc != CUDA_SUCCESS) throw Error(driver_error("cuStreamWriteValue32", rc));
}

void StreamFlag::set(uint32_t value) {
  std::atomic_ref<uint32_t>(*host_).store(value, std::memory_order_release);
}

uint32_t StreamFlag::get() const {
  return std::atomic_ref<uint32_t>(*host_).load(std::memory_order_acquire);
}

}  // namespace moe::gpu
