// Reads pinned host memory through the SMs instead of a copy engine. A prefill streams experts
// over PCIe on a copy stream; a small cudaMemcpyAsync on the compute stream then queues behind
// those chunk copies in the copy engine (measured: milliseconds per layer), while a kernel's loads
// from mapped host memory only share the link. (Element-wise kernels such as add_inplace read
// such memory the same way when given its pointer.)
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace moe::cuda {

// dst[0, bytes) = host_src[0, bytes). host_src is page-locked host memory the device can address
// (cudaHostAlloc: with unified addressing its host pointer is valid on the device); dst is device
// memory. Both 16-byte aligned (throws otherwise). bytes = 0 does nothing.
void copy_from_host(void* dst, const void* host_src, size_t bytes, cudaStream_t stream);

}  // namespace moe::cuda
