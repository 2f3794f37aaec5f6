// The part of a GPU attention layer that qwen3moe and qwen35moe share, after the projections:
// per-head RMSNorm of q and k, NEOX RoPE of their first n_rot dims, the K/V store at the batch's
// positions and causal GQA attention over the cache.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "coordinator/gpu/vram_budget.h"
#include "experts/model_config.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/attention.h"

namespace moe::gpu {

struct AttentionHeads {
  int64_t n_head = 0, n_head_kv = 0;
};

// A batch's projections: token i's n_head q heads at q + i * q_stride, its n_head_kv k heads at
// k + i * k_stride and v heads at v + i * v_stride (strides wider than the heads when q, k and v
// come out of one stacked weight matrix side by side).
struct Projections {
  float* q;
  int64_t q_stride;
  float* k;
  int64_t k_stride;
  float* v;  // Hadamard-rotated in place for a rotated V cache
  int64_t v_stride;
};

// gpt-oss's attention: YaRN RoPE (null: the plain NEOX angles) and the mask (a sliding window,
// attention sinks).
struct AttentionOptions {
  const model::RopeYarn* yarn = nullptr;
  cuda::AttentionMask mask;
};

// q and k are normed (unless q_norm / k_norm is null) and rotated in place (and Hadamard-rotated
// for a rotated K cache); out [n, n_head * head_dim_v]. Token i is at position pos0 + i. The decode
// split's scratch grows `workspace` through `budget`. Enqueued on `stream`. With device_pos0 the
// positions start at the device int32's value when the kernels run (CUDA graphs; pos0 is the value
// at this enqueue, validated on the host).
void attend(const model::ModelConfig& cfg, AttentionHeads heads, const cuda::DeviceKvLayer& kv,
            const Projections& p, const float* q_norm, const float* k_norm, int64_t n, int64_t pos0,
            VramBudget& budget, VramBuffer& workspace, float* out, cudaStream_t stream,
            const int32_t* device_pos0 = nullptr, const AttentionOptions& opt = {});

// The scratch attend() grows `workspace` to (so a graph capture can grow it beforehand).
size_t attention_workspace_bytes(const model::ModelConfig& cfg, AttentionHeads heads, int64_t n,
                                 int64_t pos0, bool device_pos0);

}  // namespace moe::gpu
