// One captured sequence of stream work, replayed with a single launch. A decode step is ~20
// small kernels per layer; launched one by one, the host's launch cost and the gaps between
// kernels dominate the step, while a graph launch hands the whole step to the GPU at once.
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace moe::gpu {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph() { reset(); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Records what `enqueue` puts on `stream` (nothing runs yet) and instantiates it. When enqueue
  // throws, or capture or instantiation fails, the capture is ended and discarded, the graph
  // stays empty and the error propagates (moe::Error for CUDA failures).
  void capture(cudaStream_t stream, const std::function<void()>& enqueue);
  // Enqueues the recorded work on `stream`. Requires ready().
  void launch(cudaStream_t stream) const;
  bool ready() const { return exec_ != nullptr; }
  void reset() noexcept;

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace moe::gpu
