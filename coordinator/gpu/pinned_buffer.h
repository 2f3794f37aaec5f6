// Grow-only page-locked host memory for the per-layer exchanges with the GPU (router logits,
// expert lists, CPU expert activations): asynchronous copies need it, and steady-state decoding
// then allocates nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { reset(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least `bytes`; the contents are not kept when it grows.
  template <typename T = void>
  T* reserve(size_t bytes) {
    if (bytes > bytes_) {
      reset();
      MOE_CUDA_CHECK(cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault));
      bytes_ = bytes;
    }
    return static_cast<T*>(ptr_);
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void reset() {
    if (ptr_) (void)cudaFreeHost(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace moe::gpu
