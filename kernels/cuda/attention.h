// KV cache writes and causal grouped-query attention on the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/ggml_type.h"

namespace moe::cuda {

// KV cache rows on the device, one layer: row p (position) at base + p * row_bytes, row_elems
// values stored as F32, F16, Q8_0 or Q4_0 (type). k_rot / v_rot: the Hadamard block K (and the
// query) and V (and the attention output) are rotated in, 0 for none (cuda::hadamard_rows; the
// caller rotates, attention() reads the rows as stored).
struct DeviceKvLayer {
  GgmlType k_type, v_type;
  void* k;
  void* v;
  size_t k_row_bytes, v_row_bytes;
  int64_t k_elems, v_elems;
  int64_t n_ctx;
  int64_t k_rot = 0, v_rot = 0;
  // A sliding-window layer's ring (as model::KvCache::ring_rows): k and v hold `ring` rows and
  // position p lives in row p % ring; 0: a row per position (n_ctx rows). Positions are still
  // checked against n_ctx. attention() on a ring needs a window no longer than the ring can hold
  // with the batch's own rows: ring >= window + n_tokens - 1.
  int64_t ring = 0;
};

// Writes n_tokens f32 rows (k: [n_tokens, k_elems], v: [n_tokens, v_elems]) at positions pos0..
// converting to the cache types (F16 round-to-nearest-even; Q8_0 as ggml's
// quantize_row_q8_0_ref: d = amax/127, q = roundf(x * (1/d)), d stored fp16; Q4_0 as
// quantize_row_q4_0_ref), byte-identical to
// coordinator/model/kv_cache.cpp. Throws moe::Error unless pos0 >= 0 and pos0 + n_tokens <= n_ctx
// and, on a ring, n_tokens <= ring.
// With device_pos0 (a device int32) the positions start at the value it holds when the kernel
// runs, so a captured CUDA graph serves every decode step; the host still validates `pos0` (the
// position of this enqueue), and a device value outside [0, n_ctx - n_tokens] writes nothing.
// Source row t of k is at k + t * k_stride (0: k_elems; at least k_elems), likewise for v: the
// projections may sit side by side in one row. Both sides are stored by one launch.
void kv_store(const DeviceKvLayer& kv, const float* k, const float* v, int64_t n_tokens,
              int64_t pos0, cudaStream_t stream, const int32_t* device_pos0 = nullptr,
              int64_t k_stride = 0, int64_t v_stride = 0);

// gpt-oss's attention options: a sliding window (token at position p sees cache positions
// [max(0, p - window + 1), p]; 0 = no window) and attention sinks (device float[n_head]: head h's
// sink logit joins the softmax's denominator, unscaled, without a value; null = none).
struct AttentionMask {
  int64_t window = 0;
  const float* sinks = nullptr;
};

// Causal GQA attention: q [n_tokens, n_head * head_dim_k] (row stride q_stride floats), token t at
// position pos0 + t attends to cache positions [0, pos0 + t]; query head h uses kv head
// h / (n_head / n_head_kv). out [n_tokens, n_head * head_dim_v] (contiguous)
// = softmax(q·K^T * scale)·V. An online softmax runs over tiles of positions; when there are too
// few (token, kv head) blocks to fill the GPU (decode), the positions are split across blocks and
// the partial results merged by a second kernel, in device scratch from cudaMallocAsync on
// `stream`. Head dims up to 256. Does not synchronize. Decode steps and f32 caches run in f32
// throughout; prompt batches of 64 query rows or more (tokens × heads per KV head) on sm_80 and
// newer run on tensor cores, with q, the cache rows and the probabilities rounded to f16 and f32
// accumulation (attention_uses_tensor_cores says which). `mask` (AttentionMask) as
// coordinator/model/attention.cpp applies it: with a window only the positions the batch sees
// are read and split across blocks; a sink is counted once per query, in the merge or the single
// slice. Without a mask the results are those of the kernels without one, bit for bit. Throws
// moe::Error for a window < 0.
void attention(const DeviceKvLayer& kv, const float* q, int64_t q_stride, int64_t n_tokens,
               int64_t pos0, int64_t n_head, int64_t n_head_kv, int64_t head_dim_k,
               int64_t head_dim_v, float scale, float* out, cudaStream_t stream,
               const AttentionMask& mask = {});

// Whether attention() with these shapes runs the tensor-core kernel on the current device.
bool attention_uses_tensor_cores(const DeviceKvLayer& kv, int64_t n_tokens, int64_t n_head,
                                 int64_t n_head_kv, int64_t head_dim_k, int64_t head_dim_v);

// Bytes of scratch attention() needs for these shapes on the current device (0 when it does not
// split), for callers that bring their own (e.g. inside CUDA graphs or from an arena). With
// device_pos0 the size for any position (the grid is fixed at the most slices a position needs).
// An upper bound for any AttentionMask (a window changes how the positions split).
size_t attention_workspace_bytes(int64_t n_tokens, int64_t pos0, int64_t n_head, int64_t n_head_kv,
                                 int64_t head_dim_v, bool device_pos0 = false);

// attention() with caller-provided scratch of at least attention_workspace_bytes() bytes
// (workspace may be null when that is 0); throws moe::Error when it is too small. With
// device_pos0 the first position is read on the device as kv_store() describes (pos0 is still
// validated on the host); results are bit-identical to a host pos0 of the same value, with or
// without a mask (a window's first position is then computed on the device).
void attention(const DeviceKvLayer& kv, const float* q, int64_t q_stride, int64_t n_tokens,
               int64_t pos0, int64_t n_head, int64_t n_head_kv, int64_t head_dim_k,
               int64_t head_dim_v, float scale, float* out, void* workspace, size_t workspace_bytes,
               cudaStream_t stream, const int32_t* device_pos0 = nullptr,
               const AttentionMask& mask = {});

}  // namespace moe::cuda
