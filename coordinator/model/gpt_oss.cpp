#include "coordinator/model/gpt_oss.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "coordinator/model/kv_shift.h"
#include "experts/tensor_table.h"
#include "kernels/cpu/rmsnorm.h"

namespace moe::model {
namespace {

// Each of n rows of b.size() values plus b.
void add_bias_rows(float* x, const std::vector<float>& b, int64_t n) {
  const auto w = static_cast<int64_t>(b.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < w; ++j) x[i * w + j] += b[static_cast<size_t>(j)];
  }
}

}  // namespace

GptOss::GptOss(const gguf::GgufFile& f, cpu::ThreadPool& pool,
               std::unique_ptr<ExpertExecutor> experts)
    : CpuForward(f, pool) {
  if (cfg_.arch != "gpt-oss") {
    throw Error("GptOss: the file's architecture is '" + cfg_.arch + "'");
  }
  const int64_t E = cfg_.n_embd, hk = cfg_.head_dim_k, hv = cfg_.head_dim_v;
  const int64_t X = cfg_.n_expert;
  // llama.cpp shapes q, k and v as heads of n_rot values: the rotation covers the whole head.
  if (cfg_.n_rot != hk || hk != hv) {
    throw Error(cfg_.arch + ".rope.dimension_count: gpt-oss rotates whole heads of equal K and V " +
                "size (" + std::to_string(hk) + ", " + std::to_string(hv) + "), found " +
                std::to_string(cfg_.n_rot));
  }
  rope_ = rope_params(cfg_);
  std::vector<ExpertLayerTensors> expert_tensors;
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer L;
    L.n_head = cfg_.n_head[static_cast<size_t>(l)];
    L.n_head_kv = cfg_.n_head_kv[static_cast<size_t>(l)];
    const int64_t qw = L.n_head * hk, kw = L.n_head_kv * hk;
    L.attn_norm = vector_f32(require_tensor(f, p + "attn_norm.weight", {E}));
    L.post_norm = vector_f32(require_tensor(f, p + "post_attention_norm.weight", {E}));
    L.wq = weight_matrix(require_tensor(f, p + "attn_q.weight", {E, qw}));
    L.wk = weight_matrix(require_tensor(f, p + "attn_k.weight", {E, kw}));
    L.wv = weight_matrix(require_tensor(f, p + "attn_v.weight", {E, kw}));
    L.wo = weight_matrix(require_tensor(f, p + "attn_output.weight", {qw, E}));
    L.bq = vector_f32(require_tensor(f, p + "attn_q.bias", {qw}));
    L.bk = vector_f32(require_tensor(f, p + "attn_k.bias", {kw}));
    L.bv = vector_f32(require_tensor(f, p + "attn_v.bias", {kw}));
    L.bo = vector_f32(require_tensor(f, p + "attn_output.bias", {E}));
    L.sinks = vector_f32(require_tensor(f, p + "attn_sinks.weight", {L.n_head}));
    L.router = weight_matrix(require_tensor(f, p + "ffn_gate_inp.weight", {E, X}));
    L.router_b = vector_f32(require_tensor(f, p + "ffn_gate_inp.bias", {X}));
    // Checked here even when another executor computes them: a broken file fails at load.
    expert_tensors.push_back(require_layer_experts(f, cfg_, l));
    layers_.push_back(std::move(L));
  }
  set_experts(std::move(expert_tensors), std::move(experts));
}

void GptOss::shift_context(KvCache& cache, int64_t n_keep, int64_t n_discard) {
  shift_kv(cache, cfg_, n_keep, n_discard);
}

void GptOss::reserve_layers(int64_t n) {
  const int64_t E = cfg_.n_embd, H = cfg_.max_n_head(), HK = cfg_.max_n_head_kv();
  const int64_t hd = cfg_.head_dim_k;
  grow(tmp_, n * E);
  grow(moe_out_, n * E);
  grow(q_, n * H * hd);
  grow(attn_, n * H * hd);
  grow(k_, n * HK * hd);
  grow(v_, n * HK * hd);
  grow(rope_cs_, cfg_.n_rot);
}

void GptOss::attention_block(const Layer& L, int64_t l, int64_t n,
                             std::span<const SequenceRows> seqs) {
  const int64_t hd = cfg_.head_dim_k;
  const int64_t qw = L.n_head * hd, kw = L.n_head_kv * hd;
  {
    const OpTimer timer(prof_, Op::kAttnProj,
                        weight_bytes(L.wq) + weight_bytes(L.wk) + weight_bytes(L.wv));
    const cpu::MatmulJob qkv[] = {{L.wq, xn_.data(), n, q_.data()},
                                  {L.wk, xn_.data(), n, k_.data()},
                                  {L.wv, xn_.data(), n, v_.data()}};
    cpu::matmul_batch(qkv, pool_, mm_, isa_);
    add_bias_rows(q_.data(), L.bq, n);
    add_bias_rows(k_.data(), L.bk, n);
    add_bias_rows(v_.data(), L.bv, n);
  }
  AttentionShape shape{L.n_head, L.n_head_kv, hd, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
  shape.window = cfg_.is_swa(l) ? cfg_.n_swa : 0;
  shape.sinks = L.sinks.data();
  for (const SequenceRows& s : seqs) {
    // A sliding-window layer's ring holds the window of only so many tokens stored at once.
    const int64_t step = s.cache->max_step(l);
    for (int64_t c0 = s.row0; c0 < s.row0 + s.n; c0 += step) {
      const int64_t c1 = std::min(c0 + step, s.row0 + s.n);
      const int64_t pos0 = s.pos0 + (c0 - s.row0);
      {
        const OpTimer timer(prof_, Op::kRopeStore);
        for (int64_t i = c0; i < c1; ++i) {
          const int64_t pos = pos0 + (i - c0);
          rope_angles_yarn(pos, cfg_.n_rot, cfg_.rope_freq_base, rope_, rope_cs_.data());
          rope_neox(q_.data() + i * qw, L.n_head, hd, cfg_.n_rot, rope_cs_.data());
          rope_neox(k_.data() + i * kw, L.n_head_kv, hd, cfg_.n_rot, rope_cs_.data());
          s.cache->store(l, pos, k_.data() + i * kw, v_.data() + i * kw);
        }
      }
      const OpTimer timer(prof_, Op::kAttention);
      attention(shape, q_.data() + c0 * qw, c1 - c0, pos0, *s.cache, l, attn_.data() + c0 * qw,
                pool_, attn_scratch_);
    }
  }
  {
    const OpTimer timer(prof_, Op::kAttnOut, weight_bytes(L.wo));
    cpu::matmul(L.wo, attn_.data(), n, tmp_.data(), pool_, mm_, isa_);
    add_bias_rows(tmp_.data(), L.bo, n);
  }
}

void GptOss::run_layers(int64_t n, std::span<const SequenceRows> seqs, const ForwardHooks* hooks) {
  const int64_t E = cfg_.n_embd;
  const int64_t pos0 = seqs.front().pos0;  // the hooks' (one sequence)
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    {
      const OpTimer timer(prof_, Op::kNorm);
      rmsnorm_rows(x_.data(), L.attn_norm.data(), xn_.data(), n, E, cfg_.rms_eps);
    }
    attention_block(L, l, n, seqs);
    {
      const OpTimer timer(prof_, Op::kResidual);
      add_rows(x_.data(), tmp_.data(), n * E);
    }
    // MoE block: post_attention_norm is the norm in front of it.
    {
      const OpTimer timer(prof_, Op::kNorm);
      rmsnorm_rows(x_.data(), L.post_norm.data(), xn_.data(), n, E, cfg_.rms_eps);
    }
    {
      const OpTimer timer(prof_, Op::kRoutedExperts);
      moe_.run(l, L.router, xn_.data(), n, pos0, hooks, moe_out_.data(), pool_, mm_, isa_,
               L.router_b.data());
    }
    {
      const OpTimer timer(prof_, Op::kResidual);
      add_rows(x_.data(), moe_out_.data(), n * E);
    }
    if (hooks && hooks->observe_layer) hooks->observe_layer(moe_.trace(l, pos0, n, x_.data()));
  }
}

}  // namespace moe::model
