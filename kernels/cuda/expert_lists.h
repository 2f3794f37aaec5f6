// Device-side expert lists for decode: after router_topk has chosen the experts on the GPU, the
// grouped matmuls need each item's weight pointers. Building them on the device keeps a decode
// step free of host round trips when every expert of the layer is in VRAM.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moe::cuda {

// For item i < n_items with expert e = ids[i] (0 <= e < n_expert, as router_topk writes):
// gate[i] = table[3e], up[i] = table[3e + 1], down[i] = table[3e + 2]. An id out of range gives
// null pointers (never an out-of-bounds read of the table).
void gather_expert_pointers(const int32_t* ids, int64_t n_items, const void* const* table,
                            int64_t n_expert, const void** gate, const void** up, const void** down,
                            cudaStream_t stream);

}  // namespace moe::cuda
