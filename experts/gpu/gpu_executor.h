// Where the routed-expert kernels of a GPU forward run: on the coordinator's own stream (in the
// coordinator's process, the default: it measured faster), or in a moe-gpu-worker process that
// holds the same VRAM mapped at the same addresses (remote_gpu_executor.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include "experts/gpu/kernel_batch.h"

namespace moe::gpu {

// Where a VramBudget's allocations come from (default: cudaMalloc).
class VramAllocator {
 public:
  virtual ~VramAllocator() = default;
  // At least `bytes` of device memory, or nullptr with `why` saying what failed.
  virtual void* allocate(size_t bytes, std::string& why) = 0;
  // Frees `p`; waits for the device work that may use it first (as cudaFree does).
  virtual void release(void* p) noexcept = 0;
};

class GpuExecutor {
 public:
  virtual ~GpuExecutor() = default;
  // Runs `batch` after the work enqueued on `stream` so far; what is enqueued on `stream` later
  // runs after the batch. Throws moe::Error when the executor is gone (its worker died).
  virtual void submit(const KernelBatch& batch, cudaStream_t stream) = 0;
  // True when the batches run in another process: nothing submitted can be captured in a CUDA
  // graph of the coordinator's stream.
  virtual bool remote() const = 0;
  // The allocator every VRAM allocation must use (nullptr: cudaMalloc).
  virtual VramAllocator* allocator() = 0;
  // One line for the printed placement.
  virtual std::string describe() const = 0;
};

// Replays each batch on the coordinator's stream at once.
class InProcessGpuExecutor : public GpuExecutor {
 public:
  // `why`: when a worker process was asked for and could not be used, the reason (printed).
  explicit InProcessGpuExecutor(std::string why = {}) : why_(std::move(why)) {}
  void submit(const KernelBatch& batch, cudaStream_t stream) override { batch.replay(stream); }
  bool remote() const override { return false; }
  VramAllocator* allocator() override { return nullptr; }
  std::string describe() const override {
    return "GPU executor in the coordinator's process" + (why_.empty() ? "" : " (" + why_ + ")");
  }

 private:
  std::string why_;
};

}  // namespace moe::gpu
