// RAII owner of one cudaMalloc allocation: freed on destruction, movable, never copied.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace moe::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `bytes` of device memory (none for 0); throws moe::Error when cudaMalloc fails.
  explicit DeviceBuffer(size_t bytes) : size_(bytes) {
    if (bytes > 0) MOE_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  ~DeviceBuffer() { reset(); }

  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return size_; }

 private:
  // A destructor cannot throw: a failing cudaFree (only possible once the context is already
  // broken, and then reported by the next checked call) is ignored here.
  void reset() noexcept {
    if (ptr_) (void)cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }

  void* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace moe::cuda
