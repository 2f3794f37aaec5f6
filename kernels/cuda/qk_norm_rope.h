// The start of an attention layer after the q/k projections, fused: per-head RMSNorm of q and k,
// then NEOX RoPE of their first n_rot dims, in one launch with one block per (token, head).
// Bit-identical to rmsnorm() on every head followed by rope_neox() on q and on k (same float
// operations in the same order); the separate calls cost four launches and a single-block RoPE.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/rope.h"

namespace moe::cuda {

struct QkHeads {
  float* x = nullptr;      // [n_tokens, row_stride]: n_head heads of head_dim from column 0
  int64_t row_stride = 0;  // >= n_head * head_dim
  int64_t n_head = 0;
  const float* norm = nullptr;  // head_dim gains; null: no RMSNorm for this side (RoPE only)
};

// For token t (position pos0 + t) and every head of q and k: v = v / sqrt(mean(v^2) + eps) * norm
// (sum of squares in double), then dims i < n_rot/2 and i + n_rot/2 rotated by
// theta_i = pos * powf(freq_base, -2/n_rot)^i (repeated float multiplication); dims >= n_rot are
// only normalised; columns past n_head * head_dim are untouched. Throws moe::Error for bad
// shapes or null pointers; enqueued on `stream`. With device_pos0 (a device int32) pos0 is the
// value it holds when the kernel runs (one CUDA graph serves every decode step). A side whose
// `norm` is null is not normalised (gpt-oss: RoPE only, no q/k norm).
//
// With `yarn` (gpt-oss's YaRN context extension), the angles are model::rope_angles_yarn's in
// the same float steps (the ramp between corr_low and corr_high mixing freq_scale * theta_i and
// theta_i, cos and sin times mscale), applied in the same NEOX layout; null: the plain angles
// above, bit-identical to the call without it.
//
// With `store`, the same launch also writes the batch's rows of an f16 KV cache, as kv_store()
// would from the k rows it leaves and the given v rows (the same bytes): one launch fewer per
// decode layer. Throws unless pos0 + n_tokens <= store->n_ctx; a device position outside [0,
// n_ctx - n_tokens] writes no cache row.
struct QkKvStoreF16 {
  void* k_cache;  // row p at k_cache + p * k_row_bytes: k.n_head heads of head_dim halves
  void* v_cache;  // row p at v_cache + p * v_row_bytes: k.n_head heads of head_dim_v halves
  size_t k_row_bytes, v_row_bytes;
  int64_t n_ctx;
  const float* v;  // [n_tokens] rows of stride v_stride
  int64_t v_stride;
  int64_t head_dim_v;
};
void qk_norm_rope(const QkHeads& q, const QkHeads& k, int64_t n_tokens, int64_t head_dim, float eps,
                  int64_t n_rot, int64_t pos0, float freq_base, cudaStream_t stream,
                  const int32_t* device_pos0 = nullptr, const QkKvStoreF16* store = nullptr,
                  const model::RopeYarn* yarn = nullptr);

}  // namespace moe::cuda
