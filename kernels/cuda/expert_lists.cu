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

__global__ void publish_split_kernel(const int32_t* ids, const float* weights,
                                     const void* const* gate, int n_tokens, int k, const float* x,
                                     int64_t n_x, uint32_t seq, SplitRoutingOut out) {
  const int n_items = n_tokens * k;
  if (threadIdx.x == 0) {
    // Hits in routing order per token: combine_rows then adds them as the host-routed split does.
    int c = 0;
    for (int t = 0; t < n_tokens; ++t) {
      out.tok_off[t] = c;
      for (int j = 0; j < k; ++j) {
        const int i = t * k + j;
        if (gate[i] != nullptr) {
          out.rows[c] = i;
          out.weights[c] = weights[i];
          ++c;
        }
      }
    }
    out.tok_off[n_tokens] = c;
  }
  for (int i = threadIdx.x; i < n_items; i += blockDim.x) {
    out.host_ids[i] = ids[i];
    out.host_weights[i] = weights[i];
    out.host_hit[i] = gate[i] != nullptr ? 1 : 0;
  }
  for (int64_t i = threadIdx.x; i < n_x; i += blockDim.x) out.host_x[i] = x[i];
  // Each thread's host writes are ordered before the flag, which one thread stores after all of
  // them (the fence-then-barrier pattern of a grid-wide signal).
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) *reinterpret_cast<volatile uint32_t*>(out.host_flag) = seq;
}

// Counts per expert, their exclusive sums as offsets, then each item's row from its expert's
// running counter (shared-memory atomics: one block).
__global__ void group_items_kernel(const int32_t* ids, int n_items, int k, int n_expert,
                                   int32_t* offsets, int32_t* x_rows, int32_t* row_expert,
                                   int32_t* pos) {
  extern __shared__ int counts[];  // [n_expert] counts, then [n_expert] next rows
  int* next = counts + n_expert;
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n_items; i += blockDim.x) {
    const int e = ids[i];
    atomicAdd(&counts[e >= 0 && e < n_expert ? e : 0], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int e = 0; e < n_expert; ++e) {
      offsets[e] = sum;
      next[e] = sum;
      sum += counts[e];
    }
    offsets[n_expert] = sum;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_items; i += blockDim.x) {
    const int id = ids[i];
    const int e = id >= 0 && id < n_expert ? id : 0;
    const int r = atomicAdd(&next[e], 1);
    x_rows[r] = i / k;
    row_expert[r] = e;
    pos[i] = r;
  }
}

}  // namespace

void group_items_by_expert(const int32_t* ids, int64_t n_items, int64_t k, int64_t n_expert,
                           int32_t* offsets, int32_t* x_rows, int32_t* row_expert, int32_t* pos,
                           cudaStream_t stream) {
  if (k < 1 || n_items < k || n_items % k != 0 || n_items > (int64_t{1} << 30) || n_expert < 1 ||
      n_expert > 4096) {
    throw Error("group_items_by_expert: invalid sizes");
  }
  if (!ids || !offsets || !x_rows || !row_expert || !pos) {
    throw Error("group_items_by_expert: null pointer");
  }
  const size_t shared = 2 * static_cast<size_t>(n_expert) * sizeof(int);
  group_items_kernel<<<1, 1024, shared, stream>>>(ids, static_cast<int>(n_items),
                                                  static_cast<int>(k), static_cast<int>(n_expert),
                                                  offsets, x_rows, row_expert, pos);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void publish_split_routing(const int32_t* ids, const float* weights, const void* const* gate,
                           int64_t n_tokens, int64_t k, const float* x, int64_t n_embd,
                           uint32_t seq, const SplitRoutingOut& out, cudaStream_t stream) {
  if (n_tokens < 1 || k < 1 || n_embd < 1 || n_tokens * k > 1024) {
    throw Error("publish_split_routing: invalid sizes");
  }
  if (!ids || !weights || !gate || !x || !out.tok_off || !out.rows || !out.weights ||
      !out.host_ids || !out.host_weights || !out.host_hit || !out.host_x || !out.host_flag) {
    throw Error("publish_split_routing: null pointer");
  }
  publish_split_kernel<<<1, 256, 0, stream>>>(ids, weights, gate, static_cast<int>(n_tokens),
                                              static_cast<int>(k), x, n_tokens * n_embd, seq, out);
  MOE_CUDA_CHECK(cudaGetLastError());
}

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
