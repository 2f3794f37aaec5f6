// Causal GQA attention for a decode step (attention_decode.cu): a few query rows (a token's query
// heads of one KV head) against a long cache. attention.cu's tiled f32 kernel stages every tile in
// shared memory for 8 warps behind two barriers; at 32k positions that reached ~7% of the memory
// bandwidth. Here each warp walks its own positions, streaming their K/V head slices into its own
// shared-memory ring by cp.async (7 positions in flight), no block barriers in the loop, and the
// query rows share each K/V row read. Only .cu files include this.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_args.cuh"

namespace moe::cuda {

constexpr int kDecodeMaxRows = 8;  // query rows (token, head of the KV head) per block

// Whether the decode kernel serves this call: at most kDecodeMaxRows query rows per KV head, head
// dims in (32, kMaxHeadDim] (whole 32-value blocks for the block types), and head slices that
// split into 4-byte units or larger.
bool attention_decode_serves(const AttnArgs& a);

// Launches it: grid (1, KV heads, n_split position slices), partials to a.part_acc / a.part_ml as
// attention.cu's merge kernel reads them when n_split > 1.
void launch_attention_decode(const AttnArgs& a, int64_t n_head_kv, int n_split,
                             cudaStream_t stream);

}  // namespace moe::cuda
