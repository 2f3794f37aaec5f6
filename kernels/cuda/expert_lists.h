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

// A batch routed on the device (prefill, several tokens of one or more sequences), grouped by
// expert for grouped_matmul: item i (token i / k's (i % k)-th choice, ids[i] as router_topk
// writes) becomes row pos[i] of its expert e's rows offsets[e] .. offsets[e + 1] - 1 (experts in
// order; the rows of one expert in no fixed order, which changes nothing: every row's product is
// computed on its own). x_rows[r]: row r's token; row_expert[r]: its expert. An id outside
// [0, n_expert) counts as expert 0 (router_topk never writes one; no out-of-bounds write).
// offsets: device [n_expert + 1]; x_rows, row_expert, pos: device [n_items]. 1 <= k <= n_items,
// n_items % k == 0, 1 <= n_expert <= 4096. One block, enqueued on `stream`; moe::Error for bad
// arguments.
void group_items_by_expert(const int32_t* ids, int64_t n_items, int64_t k, int64_t n_expert,
                           int32_t* offsets, int32_t* x_rows, int32_t* row_expert, int32_t* pos,
                           cudaStream_t stream);

// A decode layer split between the GPU and the CPU, routed on the device (ids, weights and the
// item pointers gate[i] from gather_expert_pointers or router_decode: null = no VRAM copy).
// Device lists for combine_rows over the GPU's items (hits), in routing order per token; and, in
// page-locked host memory, what the CPU needs for the misses, then `seq` in *flag once all of it
// is visible to the host (the CPU polls the flag: no host synchronisation on the GPU's path).
struct SplitRoutingOut {
  int32_t* tok_off;     // device [n_tokens + 1]: token t's hits are entries tok_off[t] .. [t+1)
  int32_t* rows;        // device [n_items]: the item index of each hit (its expert output row)
  float* weights;       // device [n_items]: the hit's routing weight
  int32_t* host_ids;    // host [n_items]: every item's expert
  float* host_weights;  // host [n_items]
  uint8_t* host_hit;    // host [n_items]: 1 when the GPU computes the item
  float* host_x;        // host [n_tokens * n_embd]: the layer's input rows
  uint32_t* host_flag;  // host: set to seq last
};
// n_items = n_tokens * k, 1 <= n_tokens, 1 <= k, n_items <= 1024. Enqueued on `stream` (one
// block); moe::Error for bad arguments.
void publish_split_routing(const int32_t* ids, const float* weights, const void* const* gate,
                           int64_t n_tokens, int64_t k, const float* x, int64_t n_embd,
                           uint32_t seq, const SplitRoutingOut& out, cudaStream_t stream);

}  // namespace moe::cuda
