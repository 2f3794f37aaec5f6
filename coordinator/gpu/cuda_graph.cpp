#include "coordinator/gpu/cuda_graph.h"

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {

void CudaGraph::capture(cudaStream_t stream, const std::function<void()>& enqueue) {
  reset();
  // Thread-local: another thread's unrelated CUDA calls (the CPU-share runner's) cannot
  // invalidate the capture, and this thread's illegal calls (a synchronisation) fail loudly.
  MOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    enqueue();
  } catch (...) {
    (void)cudaStreamEndCapture(stream, &graph);
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // the capture's error is reported by the exception
    throw;
  }
  MOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  const cudaError_t err = cudaGraphInstantiate(&exec_, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (err != cudaSuccess) {
    exec_ = nullptr;
    cuda::throw_cuda_error(err, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
}

void CudaGraph::launch(cudaStream_t stream) const {
  if (!exec_) throw Error("CudaGraph::launch: nothing captured");
  MOE_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
}

void CudaGraph::reset() noexcept {
  if (exec_) (void)cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
}

}  // namespace moe::gpu
