#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/expert_lists.h"

namespace moe::cuda {
namespace {

__global__ void gather_pointers_kernel(const int32_t* ids, int64_t n_items,
                                       const void* const* table, int64_t n_expert,
                                       const void** gate, const void** up, const void** down) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_items) return;
  const int64_t e = ids[i];
  const bool ok = e >= 0 && e < n_expert;
  gate[i] = ok ? table[3 * e] : nullptr;
  up[i] = ok ? table[3 * e + 1] : nullptr;
  down[i] = ok ? table[3 * e + 2] : nullptr;
}

}  // namespace

void gather_expert_pointers(const int32_t* ids, int64_t n_items, const void* const* table,
                            int64_t n_expert, const void** gate, const void** up, const void** down,
                            cudaStream_t stream) {
  if (n_items < 1 || n_expert < 1 || !ids || !table || !gate || !up || !down) {
    throw Error("gather_expert_pointers: invalid arguments");
  }
  const int threads = 128;
  const auto blocks = static_cast<unsigned>((n_items + threads - 1) / threads);
  gather_pointers_kernel<<<blocks, threads, 0, stream>>>(ids, n_items, table, n_expert, gate, up,
                                                         down);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
