#include "coordinator/model/qwen3moe.h"

#include <cmath>
#include <string>

#include "common/error.h"
#include "experts/tensor_table.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"

namespace moe::model {
Qwen3Moe::Qwen3Moe(const gguf::GgufFile& f, cpu::ThreadPool& pool,
                   std::unique_ptr<ExpertExecutor> experts)
    : CpuForward(f, pool) {
  const int64_t E = cfg_.n_embd, hk = cfg_.head_dim_k, hv = cfg_.head_dim_v;
  const int64_t X = cfg_.n_expert, F = cfg_.n_ff_exp;
  if (cfg_.n_rot != hk) {
    throw Error(cfg_.arch + ".rope.dimension_count: qwen3moe rotates the whole head (" +
                std::to_string(hk) + "), found " + std::to_string(cfg_.n_rot));
  }
  std::vector<ExpertLayerTensors> expert_tensors;
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer L;
    L.n_head = cfg_.n_head[static_cast<size_t>(l)];
    L.n_head_kv = cfg_.n_head_kv[static_cast<size_t>(l)];
    L.attn_norm = vector_f32(require_tensor(f, p + "attn_norm.weight", {E}));
    L.q_norm = vector_f32(require_tensor(f, p + "attn_q_norm.weight", {hk}));
    L.k_norm = vector_f32(require_tensor(f, p + "attn_k_norm.weight", {hk}));
    L.ffn_norm = vector_f32(require_tensor(f, p + "ffn_norm.weight", {E}));
    L.wq = weight_matrix(require_tensor(f, p + "attn_q.weight", {E, L.n_head * hk}));
    L.wk = weight_matrix(require_tensor(f, p + "attn_k.weight", {E, L.n_head_kv * hk}));
    L.wv = weight_matrix(require_tensor(f, p + "attn_v.weight", {E, L.n_head_kv * hv}));
    L.wo = weight_matrix(require_tensor(f, p + "attn_output.weight", {L.n_head * hv, E}));
    L.router = weight_matrix(require_tensor(f, p + "ffn_gate_inp.weight", {E, X}));
    // Checked here even when another executor computes them: a broken file fails at load.
    expert_tensors.push_back(require_expert_tensors(f, l, E, F, X));
    layers_.push_back(std::move(L));
  }
  set_experts(std::move(expert_tensors), std::move(experts));
}

void Qwen3Moe::reserve_layers(int64_t n) {
  const int64_t E = cfg_.n_embd, H = cfg_.max_n_head(), HK = cfg_.max_n_head_kv();
  const int64_t hd = std::max(cfg_.head_dim_k, cfg_.head_dim_v);
  grow(tmp_, n * E);
  grow(moe_out_, n * E);
  grow(q_, n * H * hd);
  grow(attn_, n * H * hd);
  grow(k_, n * HK * hd);
  grow(v_, n * HK * hd);
  grow(rope_cs_, cfg_.n_rot);
}

void Qwen3Moe::run_layers(int64_t n, std::span<const SequenceRows> seqs,
                          const ForwardHooks* hooks) {
  const int64_t E = cfg_.n_embd, hk = cfg_.head_dim_k, hv = cfg_.head_dim_v;
  const int64_t pos0 = seqs.front().pos0;  // the hooks' (one sequence)
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    const int64_t qw = L.n_head * hk, kw = L.n_head_kv * hk, vw = L.n_head_kv * hv;
    const int64_t ow = L.n_head * hv;
    // Attention block.
    {
      const OpTimer timer(prof_, Op::kNorm);
      rmsnorm_rows(x_.data(), L.attn_norm.data(), xn_.data(), n, E, cfg_.rms_eps);
    }
    {
      // One dispatch and one conversion of xn for the three projections when decoding.
      const OpTimer timer(prof_, Op::kAttnProj,
                          weight_bytes(L.wq) + weight_bytes(L.wk) + weight_bytes(L.wv));
      const cpu::MatmulJob qkv[] = {{L.wq, xn_.data(), n, q_.data()},
                                    {L.wk, xn_.data(), n, k_.data()},
                                    {L.wv, xn_.data(), n, v_.data()}};
      cpu::matmul_batch(qkv, pool_, mm_, isa_);
    }
    {
      // q/k RMSNorm per head (one shared gain vector over head_dim), before RoPE.
      const OpTimer timer(prof_, Op::kNorm);
      rmsnorm_rows(q_.data(), L.q_norm.data(), q_.data(), n * L.n_head, hk, cfg_.rms_eps);
      rmsnorm_rows(k_.data(), L.k_norm.data(), k_.data(), n * L.n_head_kv, hk, cfg_.rms_eps);
    }
    const AttentionShape shape{L.n_head, L.n_head_kv, hk, hv,
                               1.0f / std::sqrt(static_cast<float>(hk))};
    // Positions, K/V and attention are each sequence's own.
    for (const SequenceRows& s : seqs) {
      {
        const OpTimer timer(prof_, Op::kRopeStore);
        for (int64_t i = s.row0; i < s.row0 + s.n; ++i) {
          const int64_t pos = s.pos0 + (i - s.row0);
          rope_angles(pos, cfg_.n_rot, cfg_.rope_freq_base, rope_cs_.data());
          rope_neox(q_.data() + i * qw, L.n_head, hk, cfg_.n_rot, rope_cs_.data());
          rope_neox(k_.data() + i * kw, L.n_head_kv, hk, cfg_.n_rot, rope_cs_.data());
          s.cache->store(l, pos, k_.data() + i * kw, v_.data() + i * vw);
        }
      }
      const OpTimer timer(prof_, Op::kAttention);
      attention(shape, q_.data() + s.row0 * qw, s.n, s.pos0, *s.cache, l,
                attn_.data() + s.row0 * ow, pool_, attn_scratch_);
    }
    {
      const OpTimer timer(prof_, Op::kAttnOut, weight_bytes(L.wo));
      cpu::matmul(L.wo, attn_.data(), n, tmp_.data(), pool_, mm_, isa_);
    }
    {
      const OpTimer timer(prof_, Op::kResidual);
      add_rows(x_.data(), tmp_.data(), n * E);
    }

    // MoE block.
    {
      const OpTimer timer(prof_, Op::kNorm);
      rmsnorm_rows(x_.data(), L.ffn_norm.data(), xn_.data(), n, E, cfg_.rms_eps);
    }
    {
      const OpTimer timer(prof_, Op::kRoutedExperts);
      moe_.run(l, L.router, xn_.data(), n, pos0, hooks, moe_out_.data(), pool_, mm_, isa_);
    }
    {
      const OpTimer timer(prof_, Op::kResidual);
      add_rows(x_.data(), moe_out_.data(), n * E);
    }

    if (hooks && hooks->observe_layer) hooks->observe_layer(moe_.trace(l, pos0, n, x_.data()));
  }
}

}  // namespace moe::model
