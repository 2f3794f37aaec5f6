#include "coordinator/gpu/attention_gpu.h"

#include <cmath>

#include "coordinator/gpu/gpu_upload.h"
#include "kernels/cuda/hadamard.h"
#include "kernels/cuda/qk_norm_rope.h"

namespace moe::gpu {

void attend(const model::ModelConfig& cfg, AttentionHeads heads, const cuda::DeviceKvLayer& kv,
            const Projections& p, const float* q_norm, const float* k_norm, int64_t n, int64_t pos0,
            VramBudget& budget, VramBuffer& workspace, float* out, cudaStream_t stream,
            const int32_t* device_pos0, const AttentionOptions& opt) {
  const int64_t H = heads.n_head, HK = heads.n_head_kv, hk = cfg.head_dim_k, hv = cfg.head_dim_v;
  // An f16 cache (the default) is written by the norm + RoPE launch itself; others, and a
  // sliding-window ring, by kv_store.
  const bool f16 = kv.k_type == GgmlType::F16 && kv.v_type == GgmlType::F16 &&
                   kv.k_elems == HK * hk && kv.v_elems == HK * hv && kv.k_rot == 0 &&
                   kv.v_rot == 0 && kv.ring == 0;
  const cuda::QkKvStoreF16 store{kv.k,     kv.v, kv.k_row_bytes, kv.v_row_bytes,
                                 kv.n_ctx, p.v,  p.v_stride,     hv};
  cuda::qk_norm_rope({p.q, p.q_stride, H, q_norm}, {p.k, p.k_stride, HK, k_norm}, n, hk,
                     cfg.rms_eps, cfg.n_rot, pos0, cfg.rope_freq_base, stream, device_pos0,
                     f16 ? &store : nullptr, opt.yarn);
  // A rotated cache holds H·k and H·v: the query is rotated alike (q·k unchanged), and the output
  // rotated back below (H is its own inverse). The projections are scratch, rotated in place.
  if (kv.k_rot > 0) {
    cuda::hadamard_rows(p.q, n, p.q_stride, H * hk, kv.k_rot, stream);
    cuda::hadamard_rows(p.k, n, p.k_stride, HK * hk, kv.k_rot, stream);
  }
  if (kv.v_rot > 0) cuda::hadamard_rows(p.v, n, p.v_stride, HK * hv, kv.v_rot, stream);
  if (!f16) cuda::kv_store(kv, p.k, p.v, n, pos0, stream, device_pos0, p.k_stride, p.v_stride);
  // Decode splits the positions across blocks; its scratch comes from the budget too.
  const size_t ws = attention_workspace_bytes(cfg, heads, n, pos0, device_pos0 != nullptr);
  if (ws > 0) grow_scratch(budget, workspace, (ws + 3) / 4, "attention scratch");
  cuda::attention(kv, p.q, p.q_stride, n, pos0, H, HK, hk, hv,
                  1.0f / std::sqrt(static_cast<float>(hk)), out, ws > 0 ? workspace.get() : nullptr,
                  ws, stream, device_pos0, opt.mask);
  if (kv.v_rot > 0) cuda::hadamard_rows(out, n, H * hv, H * hv, kv.v_rot, stream);
}

size_t attention_workspace_bytes(const model::ModelConfig& cfg, AttentionHeads heads, int64_t n,
                                 int64_t pos0, bool device_pos0) {
  return cuda::attention_workspace_bytes(n, pos0, heads.n_head, heads.n_head_kv, cfg.head_dim_v,
                                         device_pos0);
}

}  // namespace moe::gpu
