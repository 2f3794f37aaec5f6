#include "coordinator/model/qwen35moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "experts/cpu_expert_executor.h"
#include "experts/tensor_table.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/causal_conv.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/gated_delta_net.h"
#include "kernels/cpu/l2norm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"

namespace moe::model {
Qwen35Moe::Qwen35Moe(const gguf::GgufFile& f, cpu::ThreadPool& pool,
                     std::unique_ptr<ExpertExecutor> experts)
    : CpuForward(f, pool) {
  if (cfg_.arch != "qwen35moe") {
    throw Error("Qwen35Moe: the file's architecture is '" + cfg_.arch + "'");
  }
  const int64_t E = cfg_.n_embd;
  const int64_t X = cfg_.n_expert, F = cfg_.n_ff_exp;
  const int64_t C = cfg_.ssm_conv_channels(), KC = cfg_.ssm_conv_kernel;
  const int64_t NV = cfg_.ssm_n_v_heads, DV = cfg_.ssm_head_v(), DI = cfg_.ssm_inner;
  std::vector<ExpertLayerTensors> expert_tensors;
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer L;
    L.recurrent = cfg_.is_recurrent(l);
    L.attn_norm = vector_f32(require_tensor(f, p + "attn_norm.weight", {E}));
    L.post_norm = vector_f32(require_tensor(f, p + "post_attention_norm.weight", {E}));
    if (L.recurrent) {
      L.wqkv = weight_matrix(require_tensor(f, p + "attn_qkv.weight", {E, C}));
      L.wz = weight_matrix(require_tensor(f, p + "attn_gate.weight", {E, DI}));
      L.wbeta = weight_matrix(require_tensor(f, p + "ssm_beta.weight", {E, NV}));
      L.walpha = weight_matrix(require_tensor(f, p + "ssm_alpha.weight", {E, NV}));
      L.wssm_out = weight_matrix(require_tensor(f, p + "ssm_out.weight", {DI, E}));
      // The file stores [channels][taps]; tap-major rows let the conv run over channels.
      const std::vector<float> conv =
          vector_f32(require_tensor(f, p + "ssm_conv1d.weight", {KC, C}));
      L.conv_w.resize(conv.size());
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t i = 0; i < KC; ++i) {
          L.conv_w[static_cast<size_t>(i * C + c)] = conv[static_cast<size_t>(c * KC + i)];
        }
      }
      L.dt_bias = vector_f32(require_tensor(f, p + "ssm_dt.bias", {NV}));
      L.ssm_a = vector_f32(require_tensor(f, p + "ssm_a", {NV}));
      L.ssm_norm = vector_f32(require_tensor(f, p + "ssm_norm.weight", {DV}));
    } else {
      load_attention(f, p, cfg_.n_head[static_cast<size_t>(l)],
                     cfg_.n_head_kv[static_cast<size_t>(l)], L);
    }
    load_ffn(f, p, L);
    // Checked here even when another executor computes them: a broken file fails at load.
    expert_tensors.push_back(require_expert_tensors(f, l, E, F, X));
    layers_.push_back(std::move(L));
  }
  set_experts(std::move(expert_tensors), std::move(experts));
  load_mtp(f);
}

void Qwen35Moe::load_attention(const gguf::GgufFile& f, const std::string& p, int64_t n_head,
                               int64_t n_head_kv, Layer& L) const {
  const int64_t E = cfg_.n_embd, hk = cfg_.head_dim_k, hv = cfg_.head_dim_v;
  L.n_head = n_head;
  L.n_head_kv = n_head_kv;
  // Per head: head_dim query rows, then head_dim output-gate rows.
  L.wq = weight_matrix(require_tensor(f, p + "attn_q.weight", {E, n_head * hk * 2}));
  L.wk = weight_matrix(require_tensor(f, p + "attn_k.weight", {E, n_head_kv * hk}));
  L.wv = weight_matrix(require_tensor(f, p + "attn_v.weight", {E, n_head_kv * hv}));
  L.wo = weight_matrix(require_tensor(f, p + "attn_output.weight", {n_head * hv, E}));
  L.q_norm = vector_f32(require_tensor(f, p + "attn_q_norm.weight", {hk}));
  L.k_norm = vector_f32(require_tensor(f, p + "attn_k_norm.weight", {hk}));
}

void Qwen35Moe::load_ffn(const gguf::GgufFile& f, const std::string& p, Layer& L) const {
  const int64_t E = cfg_.n_embd, X = cfg_.n_expert, FS = cfg_.n_ff_shexp;
  L.router = weight_matrix(require_tensor(f, p + "ffn_gate_inp.weight", {E, X}));
  L.sh_gate_inp = weight_matrix(require_tensor(f, p + "ffn_gate_inp_shexp.weight", {E}));
  L.sh_gate = weight_matrix(require_tensor(f, p + "ffn_gate_shexp.weight", {E, FS}));
  L.sh_up = weight_matrix(require_tensor(f, p + "ffn_up_shexp.weight", {E, FS}));
  L.sh_down = weight_matrix(require_tensor(f, p + "ffn_down_shexp.weight", {FS, E}));
}

void Qwen35Moe::load_mtp(const gguf::GgufFile& f) {
  const int64_t E = cfg_.n_embd, l = cfg_.n_layer;
  const std::string p = "blk." + std::to_string(l) + ".";
  if (cfg_.n_nextn < 1 || !f.find_tensor(p + "nextn.eh_proj.weight")) return;
  if (cfg_.n_nextn > 1) {
    throw Error(cfg_.arch + ".nextn_predict_layers: " + std::to_string(cfg_.n_nextn) +
                " multi-token-prediction blocks (one is supported)");
  }
  auto m = std::make_unique<Mtp>();
  // Its head counts are the full-attention layers' (those of the last main attention layer).
  int64_t last_attn = -1;
  for (int64_t i = 0; i < cfg_.n_layer; ++i) last_attn = cfg_.is_recurrent(i) ? last_attn : i;
  if (last_attn < 0) throw Error("qwen35moe: an MTP block without full-attention layers");
  const auto at = static_cast<size_t>(last_attn);
  m->layer.attn_norm = vector_f32(require_tensor(f, p + "attn_norm.weight", {E}));
  m->layer.post_norm = vector_f32(require_tensor(f, p + "post_attention_norm.weight", {E}));
  load_attention(f, p, cfg_.n_head[at], cfg_.n_head_kv[at], m->layer);
  load_ffn(f, p, m->layer);
  m->eh_proj = weight_matrix(require_tensor(f, p + "nextn.eh_proj.weight", {2 * E, E}));
  m->enorm = vector_f32(require_tensor(f, p + "nextn.enorm.weight", {E}));
  m->hnorm = vector_f32(require_tensor(f, p + "nextn.hnorm.weight", {E}));
  const auto* hn = optional_tensor(f, p + "nextn.shared_head_norm.weight", {E});
  m->head_norm = hn ? vector_f32(*hn) : output_norm();
  if (const auto* hh = optional_tensor(f, p + "nextn.shared_head_head.weight", {E, cfg_.n_vocab})) {
    m->own_head = weight_matrix(*hh);
    m->head = &m->own_head;
  } else {
    m->head = &output_head();
  }
  m->embed.token_embd = optional_tensor(f, p + "nextn.embed_tokens.weight", {E, cfg_.n_vocab});
  // One full-attention layer with the main layers' shapes: its cache and its routed experts.
  mtp_cfg_ = cfg_;
  mtp_cfg_.n_layer = 1;
  mtp_cfg_.n_nextn = 0;
  mtp_cfg_.recurrent.clear();
  mtp_cfg_.n_head.assign(1, cfg_.n_head[at]);
  mtp_cfg_.n_head_kv.assign(1, cfg_.n_head_kv[at]);
  mtp_cfg_.swa.clear();
  std::vector<ExpertLayerTensors> experts{
      require_expert_tensors(f, l, E, cfg_.n_ff_exp, cfg_.n_expert)};
  mtp_moe_.set_executor(std::make_unique<CpuExpertExecutor>(
      std::move(experts), E, cfg_.n_ff_exp, cfg_.n_expert, pool_, isa_, cfg_.expert_act));
  mtp_ = std::move(m);
}

KvCache Qwen35Moe::make_mtp_cache(int64_t n_ctx) const {
  if (!mtp_) return ModelArch::make_mtp_cache(n_ctx);
  return KvCache(mtp_cfg_, n_ctx, KvConfig::uniform(KvType::F16, KvType::F16));
}

void Qwen35Moe::mtp_forward(std::span<const int32_t> tokens, const float* h, KvCache& cache,
                            float* h_out, float* logits) {
  if (!mtp_) return ModelArch::mtp_forward(tokens, h, cache, h_out, logits);
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t E = cfg_.n_embd;
  if (n < 1) throw Error("mtp_forward: no tokens");
  for (const int32_t t : tokens) {
    if (t < 0 || t >= cfg_.n_vocab) throw Error("mtp_forward: token " + std::to_string(t));
  }
  cache.check_room(n);
  // x_, xn_ and the layer scratch are the main forward's: grown to n rows, as a forward would.
  reserve(n);
  mtp_moe_.reserve(n);
  Mtp& m = *mtp_;
  // x = eh_proj([enorm(embedding) | hnorm(h)]).
  if (m.embed.token_embd) {
    m.embed.embed(tokens, x_.data());
  } else {
    embed_rows(tokens, x_.data());
  }
  grow(mtp_in_, n * 2 * E);
  for (int64_t i = 0; i < n; ++i) {
    rmsnorm_rows(x_.data() + i * E, m.enorm.data(), mtp_in_.data() + i * 2 * E, 1, E, cfg_.rms_eps);
    rmsnorm_rows(h + i * E, m.hnorm.data(), mtp_in_.data() + i * 2 * E + E, 1, E, cfg_.rms_eps);
  }
  cpu::matmul(m.eh_proj, mtp_in_.data(), n, x_.data(), pool_, mm_, isa_);
  // Then one gated attention layer with its experts, as a main layer runs.
  const SequenceRows seq{0, n, cache.n_past(), &cache};
  rmsnorm_rows(x_.data(), m.layer.attn_norm.data(), xn_.data(), n, E, cfg_.rms_eps);
  attention_layer(m.layer, 0, n, std::span<const SequenceRows>(&seq, 1));
  for (int64_t i = 0; i < n * E; ++i) {
    const auto ii = static_cast<size_t>(i);
    h_[ii] = x_[ii] + mix_[ii];
  }
  rmsnorm_rows(h_.data(), m.layer.post_norm.data(), xn_.data(), n, E, cfg_.rms_eps);
  ffn(m.layer, mtp_moe_, 0, n, seq.pos0, nullptr);
  rmsnorm_rows(x_.data(), m.head_norm.data(), h_out, n, E, cfg_.rms_eps);
  if (logits) cpu::matmul(*m.head, h_out + (n - 1) * E, 1, logits, pool_, mm_, isa_);
  cache.advance(n);
}

void Qwen35Moe::reserve_layers(int64_t n) {
  const int64_t E = cfg_.n_embd, C = cfg_.ssm_conv_channels(), DI = cfg_.ssm_inner;
  const int64_t NV = cfg_.ssm_n_v_heads, hd = std::max(cfg_.head_dim_k, cfg_.head_dim_v);
  const int64_t H = cfg_.max_n_head(), HK = cfg_.max_n_head_kv();
  for (auto* b : {&h_, &mix_, &moe_out_, &sh_out_}) grow(*b, n * E);
  grow(qkv_, n * C);
  grow(conv_, n * C);
  grow(z_, n * DI);
  grow(ssm_o_, n * DI);
  grow(beta_, n * NV);
  grow(gate_, n * NV);
  grow(qg_, n * H * hd * 2);
  for (auto* b : {&q_, &ogate_, &attn_}) grow(*b, n * H * hd);
  grow(k_, n * HK * hd);
  grow(v_, n * HK * hd);
  grow(rope_cs_, cfg_.n_rot);
  grow(sh_g_, n * cfg_.n_ff_shexp);
  grow(sh_u_, n * cfg_.n_ff_shexp);
  grow(sh_s_, n);
}

void Qwen35Moe::delta_net_layer(const Layer& L, int64_t l, int64_t n,
                                std::span<const SequenceRows> seqs) {
  const int64_t C = cfg_.ssm_conv_channels(), NK = cfg_.ssm_n_k_heads, NV = cfg_.ssm_n_v_heads;
  const int64_t DK = cfg_.ssm_head_k, DV = cfg_.ssm_head_v();
  {
    // One dispatch (and one conversion of xn per activation format) for the four projections.
    const OpTimer timer(
        prof_, Op::kSsmProj,
        weight_bytes(L.wqkv) + weight_bytes(L.wz) + weight_bytes(L.wbeta) + weight_bytes(L.walpha));
    const cpu::MatmulJob in[] = {{L.wqkv, xn_.data(), n, qkv_.data()},
                                 {L.wz, xn_.data(), n, z_.data()},
                                 {L.wbeta, xn_.data(), n, beta_.data()},
                                 {L.walpha, xn_.data(), n, gate_.data()}};
    cpu::matmul_batch(in, pool_, mm_, isa_);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < NV; ++h) {
        const auto i = static_cast<size_t>(t * NV + h), hi = static_cast<size_t>(h);
        beta_[i] = sigmoid(beta_[i]);
        // ssm_a = -exp(A_log) < 0, so g <= 0 and the decay exp(g) is at most 1.
        gate_[i] = L.ssm_a[hi] * softplus(gate_[i] + L.dt_bias[hi]);
      }
    }
  }
  {
    // The conv window and the DeltaNet matrices are each sequence's own: its rows continue its
    // RecurrentState.
    const OpTimer timer(prof_, Op::kSsmConv);
    for (const SequenceRows& s : seqs) {
      const RecurrentState::LayerView st = s.cache->recurrent(l);
      causal_conv1d({C, cfg_.ssm_conv_kernel}, qkv_.data() + s.row0 * C, s.n, L.conv_w.data(),
                    st.conv_in, st.conv_out, conv_.data() + s.row0 * C, /*silu=*/true, pool_);
    }
    // q and k heads sit side by side at the start of every conv row; tokens in parallel.
    pool_.parallel_for(
        n, [&](int64_t t, int) { l2norm_rows(conv_.data() + t * C, 2 * NK, DK, cfg_.rms_eps); });
  }
  {
    const OpTimer timer(prof_, Op::kSsmDelta);
    for (const SequenceRows& s : seqs) {
      const RecurrentState::LayerView st = s.cache->recurrent(l);
      const float* q = conv_.data() + s.row0 * C;
      gated_delta_net({NK, NV, DK, DV}, q, q + NK * DK, q + 2 * NK * DK, C,
                      gate_.data() + s.row0 * NV, beta_.data() + s.row0 * NV, s.n, st.ssm_in,
                      st.ssm_out, ssm_o_.data() + s.row0 * NV * DV, pool_);
    }
  }
  const OpTimer timer(prof_, Op::kSsmOut, weight_bytes(L.wssm_out));
  // Rows in parallel: on one thread its exp per element was ~1 ms of a token (decode or prompt).
  const int64_t rows = n * NV, per_task = 8;
  pool_.parallel_for((rows + per_task - 1) / per_task, [&](int64_t task, int) {
    const int64_t r0 = task * per_task, nr = std::min(per_task, rows - r0);
    rmsnorm_gated_rows(ssm_o_.data() + r0 * DV, L.ssm_norm.data(), z_.data() + r0 * DV,
                       ssm_o_.data() + r0 * DV, nr, DV, cfg_.rms_eps);
  });
  cpu::matmul(L.wssm_out, ssm_o_.data(), n, mix_.data(), pool_, mm_, isa_);
}

void Qwen35Moe::attention_layer(const Layer& L, int64_t l, int64_t n,
                                std::span<const SequenceRows> seqs) {
  const int64_t hk = cfg_.head_dim_k, hv = cfg_.head_dim_v;
  const int64_t qw = L.n_head * hk, kw = L.n_head_kv * hk, vw = L.n_head_kv * hv;
  const int64_t ow = L.n_head * hv;
  {
    const OpTimer timer(prof_, Op::kAttnProj,
                        weight_bytes(L.wq) + weight_bytes(L.wk) + weight_bytes(L.wv));
    const cpu::MatmulJob qkv[] = {{L.wq, xn_.data(), n, qg_.data()},
                                  {L.wk, xn_.data(), n, k_.data()},
                                  {L.wv, xn_.data(), n, v_.data()}};
    cpu::matmul_batch(qkv, pool_, mm_, isa_);
    // attn_q's rows are [query head h | gate head h] per head.
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < L.n_head; ++h) {
        const float* src = qg_.data() + t * 2 * qw + h * 2 * hk;
        std::memcpy(q_.data() + t * qw + h * hk, src, static_cast<size_t>(hk) * sizeof(float));
        std::memcpy(ogate_.data() + t * qw + h * hk, src + hk,
                    static_cast<size_t>(hk) * sizeof(float));
      }
    }
  }
  {
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
        rope_angles_imrope(pos, cfg_.n_rot, cfg_.rope_freq_base, cfg_.rope_sections.data(),
                           rope_cs_.data());
        rope_neox(q_.data() + i * qw, L.n_head, hk, cfg_.n_rot, rope_cs_.data());
        rope_neox(k_.data() + i * kw, L.n_head_kv, hk, cfg_.n_rot, rope_cs_.data());
        s.cache->store(l, pos, k_.data() + i * kw, v_.data() + i * vw);
      }
    }
    const OpTimer timer(prof_, Op::kAttention);
    attention(shape, q_.data() + s.row0 * qw, s.n, s.pos0, *s.cache, l, attn_.data() + s.row0 * ow,
              pool_, attn_scratch_);
  }
  const OpTimer timer(prof_, Op::kAttnOut, weight_bytes(L.wo));
  for (int64_t i = 0; i < n * qw; ++i) {
    attn_[static_cast<size_t>(i)] *= sigmoid(ogate_[static_cast<size_t>(i)]);
  }
  cpu::matmul(L.wo, attn_.data(), n, mix_.data(), pool_, mm_, isa_);
}

void Qwen35Moe::ffn(const Layer& L, RoutedMoeCpu& moe, int64_t l, int64_t n, int64_t pos0,
                    const ForwardHooks* hooks) {
  const int64_t E = cfg_.n_embd, FS = cfg_.n_ff_shexp;
  {
    const OpTimer timer(prof_, Op::kRoutedExperts);
    moe.run(l, L.router, xn_.data(), n, pos0, hooks, moe_out_.data(), pool_, mm_, isa_);
  }

  // Shared expert, scaled per token by sigmoid(w_gate_inp_shexp · m).
  const OpTimer timer(prof_, Op::kSharedExpert,
                      weight_bytes(L.sh_gate) + weight_bytes(L.sh_up) +
                          weight_bytes(L.sh_gate_inp) + weight_bytes(L.sh_down));
  const cpu::MatmulJob shared[] = {{L.sh_gate, xn_.data(), n, sh_g_.data()},
                                   {L.sh_up, xn_.data(), n, sh_u_.data()},
                                   {L.sh_gate_inp, xn_.data(), n, sh_s_.data()}};
  cpu::matmul_batch(shared, pool_, mm_, isa_);
  for (int64_t i = 0; i < n * FS; ++i) {
    const auto ii = static_cast<size_t>(i);
    sh_g_[ii] = silu(sh_g_[ii]) * sh_u_[ii];
  }
  cpu::matmul(L.sh_down, sh_g_.data(), n, sh_out_.data(), pool_, mm_, isa_);
  for (int64_t t = 0; t < n; ++t) {
    const float s = sigmoid(sh_s_[static_cast<size_t>(t)]);
    const float* h = h_.data() + t * E;
    const float* m = moe_out_.data() + t * E;
    const float* sh = sh_out_.data() + t * E;
    float* x = x_.data() + t * E;
    // llama.cpp's order: (routed + shared) + residual.
    for (int64_t d = 0; d < E; ++d) x[d] = (m[d] + sh[d] * s) + h[d];
  }
}

void Qwen35Moe::check_cache(const KvCache& cache) const {
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    if (cfg_.is_recurrent(l) && !cache.has_recurrent(l)) {
      throw Error("forward: the cache has no recurrent state for layer " + std::to_string(l) +
                  " (made for another model?)");
    }
  }
}

void Qwen35Moe::run_layers(int64_t n, std::span<const SequenceRows> seqs,
                           const ForwardHooks* hooks) {
  const int64_t E = cfg_.n_embd;
  const int64_t pos0 = seqs.front().pos0;  // the hooks' (one sequence)
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    {
      const OpTimer timer(prof_, Op::kNorm);
      rmsnorm_rows(x_.data(), L.attn_norm.data(), xn_.data(), n, E, cfg_.rms_eps);
    }
    if (L.recurrent) {
      delta_net_layer(L, l, n, seqs);
    } else {
      attention_layer(L, l, n, seqs);
    }
    {
      const OpTimer timer(prof_, Op::kResidual);
      for (int64_t i = 0; i < n * E; ++i) {
        const auto ii = static_cast<size_t>(i);
        h_[ii] = x_[ii] + mix_[ii];
      }
    }
    {
      const OpTimer timer(prof_, Op::kNorm);
      rmsnorm_rows(h_.data(), L.post_norm.data(), xn_.data(), n, E, cfg_.rms_eps);
    }
    ffn(L, moe_, l, n, pos0, hooks);

    if (hooks && hooks->observe_layer) {
      LayerTrace tr = moe_.trace(l, pos0, n, x_.data());
      tr.attn_residual = h_.data();
      hooks->observe_layer(tr);
    }
  }
}

}  // namespace moe::model
