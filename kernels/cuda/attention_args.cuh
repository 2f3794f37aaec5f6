// What the attention kernels share (attention.cu's f32 kernel and attention_mma.cu's tensor-core
// one): their arguments, and how the cache positions are split across grid.z and where a batch
// starts, computed alike on the host and the device so both kernels' partials merge the same way.
// Only .cu files include this.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moe::cuda {

constexpr int kMaxHeadDim = 256;
constexpr int kMinSplitPositions = 32;
constexpr int kMaxSplits = 256;
constexpr int kSplitAlign = 32;  // split lengths are whole tiles for every tile size

struct AttnArgs {
  const uint8_t* k;
  const uint8_t* v;
  size_t k_row_bytes, v_row_bytes;
  int k_code, v_code;
  const float* q;
  int64_t q_stride;
  float* out;
  int64_t n_tokens, pos0;
  const int32_t* device_pos0;  // null: pos0
  int64_t n_ctx;
  int64_t ring;  // DeviceKvLayer::ring: position p in row kv_row(p, ring)
  int n_head, group, hd_k, hd_v;
  float scale;
  int64_t window;      // AttentionMask::window (0: none)
  const float* sinks;  // AttentionMask::sinks, [n_head] (null: none)
  int split_bound;     // split_length()'s bound; the grid has gridDim.z <= split_bound slices
  float* part_acc;     // [gridDim.z][n_tokens * n_head][hd_v] when gridDim.z > 1
  float* part_ml;      // [gridDim.z][n_tokens * n_head][2]: running max, sum
};

// The first position of a batch: the host's value, or a device int32 read when the kernel runs
// (one CUDA graph then serves every decode step). A device value that would put the batch outside
// [0, n_ctx) is refused on the device (-1: nothing is written or read).
__device__ __forceinline__ int64_t batch_pos0(const int32_t* device_pos0, int64_t pos0,
                                              int64_t n_tokens, int64_t n_ctx) {
  if (!device_pos0) return pos0;
  const int64_t p = *device_pos0;
  return p >= 0 && p + n_tokens <= n_ctx ? p : -1;
}

// The first cache position a token at `pos` sees (AttentionMask::window; 0 = all from 0), as
// coordinator/model/attention.cpp's first_visible().
__host__ __device__ inline int64_t first_visible(int64_t window, int64_t pos) {
  return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

// The split's positions: [first_visible(pos0), pos0 + n_tokens) (the union of what the batch's
// tokens see), so a sliding window's earlier positions are never in any slice.
__host__ __device__ inline int64_t split_first(int64_t window, int64_t pos0) {
  return first_visible(window, pos0);
}

// A row's final normalization with a sink (one slice: m, l, acc of the row's whole range; the
// merge: M over the slices, l the rescaled sum): the sink joins the max and the denominator,
// unscaled and without a value, as attend_rows does. Rounded step by step (no contraction) so the
// merge of one non-empty slice and the single-slice kernels give the same bits: out = acc * c /
// den, c = e^(m - M), den = l * c + e^(sink - M), M = max(m, sink).
struct SinkNorm {
  float c, den;
};
__device__ __forceinline__ SinkNorm sink_norm(float m, float l, float sink) {
  const float mx = fmaxf(m, sink);
  const float c = expf(m - mx);
  return {c, __fadd_rn(__fmul_rn(l, c), expf(sink - mx))};
}

// Positions per grid.z slice for n_kv visible positions and at most `bound` slices: as few
// slices as fill the GPU, none shorter than kMinSplitPositions, whole tiles. Host and device
// compute it alike, so a graph's fixed grid (bound slices, the tail ones empty) gives the same
// partial results as an eager launch of exactly the slices needed.
__host__ __device__ inline int64_t split_length(int64_t n_kv, int64_t bound) {
  int64_t n = (n_kv + kMinSplitPositions - 1) / kMinSplitPositions;
  n = n < bound ? n : bound;
  n = n > 1 ? n : 1;
  const int64_t len = (n_kv + n - 1) / n;
  return (len + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
}

}  // namespace moe::cuda
