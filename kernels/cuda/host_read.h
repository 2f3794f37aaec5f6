// Reads pinned host memory through the SMs instead of a copy engine. A prefill streams experts
// over PCIe on a copy stream; a small cudaMemcpyAsync on the compute stream then queues behind
// those chunk copies in the copy engine (measured: milliseconds per layer), while a kernel's loads
// from mapped host memory only share the link.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace moe::cuda {

// dst[0, bytes) = host_src[0, bytes). host_src is page-locked host memory the device can address
// (cudaHostAlloc: with unified addressing its host pointer is valid on the device); dst is device
// memory. Both 16-byte aligned (throws otherwise). bytes = 0 does nothing.
void copy_from_host(void* dst, const void* host_src, size_t bytes, cudaStream_t stream);

// x[i] += host_y[i] for i < n, host_y as copy_from_host's source: the sum of the CPU's share of a
// layer joins the GPU's without a copy-engine transfer.
void add_from_host(float* x, const float* host_y, int64_t n, cudaStream_t stream);

}  // namespace moe::cuda
