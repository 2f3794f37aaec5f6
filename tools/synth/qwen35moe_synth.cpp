#include "tools/synth/qwen35moe_synth.h"

#include <cmath>

#include "common/error.h"
#include "common/gguf_writer.h"

namespace moe::synth {
namespace {

enum class Role { Other, Embedding, Router };

// How a tensor's values are drawn: Gaussian(std a); Gain: 1 + a * N(0, 1) (norm gains);
// Uniform in [a, b); NegLogUniform: -A with A log-uniform in [a, b] (ssm_a = -exp(A_log)).
enum class Init { Gaussian, Gain, Uniform, NegLogUniform };

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  Init init;
  float a, b;
  int layer = -1;
  Role role = Role::Other;
};

void check(const Qwen35MoeSpec& s) {
  const auto need = [](bool ok, const std::string& what) {
    if (!ok) throw Error("qwen35moe synth: " + what);
  };
  need(s.n_layer > 0 && s.n_embd > 0 && s.n_ctx > 0, "layers, width and context must be positive");
  need(s.full_attn_interval > 0, "full_attn_interval must be positive");
  need(s.n_head > 0 && s.n_head_kv > 0 && s.n_head % s.n_head_kv == 0,
       "the query heads must be a positive multiple of the KV heads");
  need(s.head_dim > 0 && s.n_rot > 0 && s.n_rot % 2 == 0 && s.n_rot <= s.head_dim,
       "rope dims must be even and at most the head dimension");
  int sections = 0;
  for (int x : s.rope_sections) {
    need(x >= 0, "rope sections must not be negative");
    sections += x;
  }
  need(sections > 0 && 2 * sections <= s.n_rot, "rope sections must cover at most n_rot / 2 pairs");
  need(s.ssm_n_k_heads > 0 && s.ssm_n_v_heads % s.ssm_n_k_heads == 0 && s.ssm_n_v_heads > 0,
       "the GDN value heads must be a positive multiple of the key heads");
  need(s.ssm_head_dim > 0 && s.ssm_conv_kernel > 0,
       "GDN head dim and conv kernel must be positive");
  need(s.n_expert > 0 && s.n_expert_used > 0 && s.n_expert_used <= s.n_expert,
       "experts used must be between 1 and the expert count");
  need(s.n_ff > 0 && s.n_ff_shexp > 0, "FFN widths must be positive");
  need(s.skew >= 0 && std::isfinite(s.skew), "skew must be a finite value >= 0");
}

// Metadata into `w`, and the tensor table (after `mutate`) added to it.
std::vector<TensorSpec> build(const Qwen35MoeSpec& s, gguf::GgufWriter& w) {
  check(s);
  const std::string a = "qwen35moe.";
  const auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  w.set_string("general.architecture", "qwen35moe");
  w.set_string("general.name", s.name);
  w.set_u32("general.file_type", file_type_of(s.wtype, s.mix));
  w.set_u32("general.quantization_version", 2);
  w.set_u32(a + "block_count", u32(s.n_layer + (s.mtp ? 1 : 0)));
  if (s.mtp) w.set_u32(a + "nextn_predict_layers", 1);
  w.set_u32(a + "context_length", u32(s.n_ctx));
  w.set_u32(a + "embedding_length", u32(s.n_embd));
  w.set_u32(a + "attention.head_count", u32(s.n_head));
  w.set_u32(a + "attention.head_count_kv", u32(s.n_head_kv));
  w.set_u32(a + "attention.key_length", u32(s.head_dim));
  w.set_u32(a + "attention.value_length", u32(s.head_dim));
  w.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.set_f32(a + "rope.freq_base", s.rope_base);
  w.set_u32(a + "rope.dimension_count", u32(s.n_rot));
  w.set_i32s(a + "rope.dimension_sections",
             std::vector<int32_t>(s.rope_sections.begin(), s.rope_sections.end()));
  w.set_u32(a + "expert_count", u32(s.n_expert));
  w.set_u32(a + "expert_used_count", u32(s.n_expert_used));
  w.set_u32(a + "expert_feed_forward_length", u32(s.n_ff));
  w.set_u32(a + "expert_shared_feed_forward_length", u32(s.n_ff_shexp));
  w.set_u32(a + "ssm.conv_kernel", u32(s.ssm_conv_kernel));
  w.set_u32(a + "ssm.state_size", u32(s.ssm_head_dim));
  w.set_u32(a + "ssm.group_count", u32(s.ssm_n_k_heads));
  w.set_u32(a + "ssm.time_step_rank", u32(s.ssm_n_v_heads));
  w.set_u32(a + "ssm.inner_size", u32(s.ssm_inner()));
  w.set_u32(a + "full_attention_interval", u32(s.full_attn_interval));
  const int64_t n_vocab = !s.vocab_from.empty() ? detail::copy_tokenizer(w, s.vocab_from)
                          : s.with_tokenizer ? detail::write_byte_tokenizer(w, s.n_vocab, "qwen35")
                                             : s.n_vocab;

  const int64_t E = s.n_embd, DI = s.ssm_inner(), C = s.ssm_conv_channels();
  const int64_t NV = s.ssm_n_v_heads, hd = s.head_dim;
  const int64_t q = int64_t{s.n_head} * hd, kv = int64_t{s.n_head_kv} * hd;
  const auto inv = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  std::vector<TensorSpec> ts;
  const auto matrix = [&](const std::string& name, std::vector<int64_t> ne, float std, int layer,
                          Role role = Role::Other) {
    const GgmlType t = tensor_type_for(s, name, layer, ne[0]);
    ts.push_back({name, t, std::move(ne), Init::Gaussian, std, 0, layer, role});
  };
  const auto f32 = [&](const std::string& name, std::vector<int64_t> ne, Init init, float x,
                       float y, int layer, Role role = Role::Other) {
    ts.push_back({name, GgmlType::F32, std::move(ne), init, x, y, layer, role});
  };
  const auto gain = [&](const std::string& name, int64_t n, int layer, float sigma = 0.1f) {
    f32(name, {n}, Init::Gain, sigma, 0, layer);
  };
  // A gated full-attention layer's tensors, and a layer's MoE block (post-attention norm, router,
  // routed and shared experts).
  const auto attention = [&](const std::string& p, int l) {
    matrix(p + "attn_q.weight", {E, 2 * q}, inv(E), l);  // per head: query rows, gate rows
    matrix(p + "attn_k.weight", {E, kv}, inv(E), l);
    matrix(p + "attn_v.weight", {E, kv}, inv(E), l);
    matrix(p + "attn_output.weight", {q, E}, 0.5f * inv(q), l);
    gain(p + "attn_q_norm.weight", hd, l, 0.2f);
    gain(p + "attn_k_norm.weight", hd, l, 0.2f);
  };
  const auto moe_block = [&](const std::string& p, int l, Role router) {
    gain(p + "post_attention_norm.weight", E, l);
    f32(p + "ffn_gate_inp.weight", {E, s.n_expert}, Init::Gaussian, inv(E), 0, l, router);
    matrix(p + "ffn_gate_exps.weight", {E, s.n_ff, s.n_expert}, inv(E), l);
    matrix(p + "ffn_up_exps.weight", {E, s.n_ff, s.n_expert}, inv(E), l);
    matrix(p + "ffn_down_exps.weight", {s.n_ff, E, s.n_expert}, inv(s.n_ff), l);
    f32(p + "ffn_gate_inp_shexp.weight", {E}, Init::Gaussian, inv(E), 0, l);
    matrix(p + "ffn_gate_shexp.weight", {E, s.n_ff_shexp}, inv(E), l);
    matrix(p + "ffn_up_shexp.weight", {E, s.n_ff_shexp}, inv(E), l);
    matrix(p + "ffn_down_shexp.weight", {s.n_ff_shexp, E}, inv(s.n_ff_shexp), l);
  };
  matrix("token_embd.weight", {E, n_vocab}, 0.5f, -1, Role::Embedding);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    gain(p + "attn_norm.weight", E, l);
    if (s.is_recurrent(l)) {
      matrix(p + "attn_qkv.weight", {E, C}, inv(E), l);
      matrix(p + "attn_gate.weight", {E, DI}, inv(E), l);
      // Tap-major per channel; std 0.5 keeps the conv output near the input's scale.
      f32(p + "ssm_conv1d.weight", {s.ssm_conv_kernel, C}, Init::Gaussian, 0.5f, 0, l);
      f32(p + "ssm_dt.bias", {NV}, Init::Uniform, -1.5f, 0.5f, l);
      // Decay rates: exp(ssm_a * softplus(.)) spans short- and long-memory heads.
      f32(p + "ssm_a", {NV}, Init::NegLogUniform, 0.02f, 1.0f, l);
      matrix(p + "ssm_beta.weight", {E, NV}, inv(E), l);
      matrix(p + "ssm_alpha.weight", {E, NV}, 0.5f * inv(E), l);
      gain(p + "ssm_norm.weight", s.ssm_head_dim, l);
      matrix(p + "ssm_out.weight", {DI, E}, 0.5f * inv(DI), l);
    } else {
      attention(p, l);
    }
    moe_block(p, l, Role::Router);
  }
  if (s.mtp) {
    // Its layer index is past the main layers': no skew ranks, types as a main layer's.
    const int l = s.n_layer;
    const std::string p = "blk." + std::to_string(l) + ".";
    matrix(p + "nextn.eh_proj.weight", {2 * E, E}, inv(2 * E), l);
    gain(p + "nextn.enorm.weight", E, l);
    gain(p + "nextn.hnorm.weight", E, l);
    gain(p + "nextn.shared_head_norm.weight", E, l);
    gain(p + "attn_norm.weight", E, l);
    attention(p, l);
    moe_block(p, l, Role::Other);
  }
  gain("output_norm.weight", E, -1);
  if (!s.tied) matrix("output.weight", {E, n_vocab}, 0.15f, -1);

  std::vector<TensorSpec> kept;
  for (TensorSpec t : ts) {
    bool skip = false;
    if (s.mutate) s.mutate(t.name, t.type, t.ne, skip);
    if (skip) continue;
    w.add_tensor(t.name, t.type, t.ne);
    kept.push_back(std::move(t));
  }
  return kept;
}

void fill(const TensorSpec& t, size_t index, const Qwen35MoeSpec& s,
          const std::vector<std::vector<int>>& rank, uint8_t* dst) {
  const int64_t n0 = t.ne[0];
  const float log_a = t.init == Init::NegLogUniform ? std::log(t.a) : 0.0f;
  const float log_b = t.init == Init::NegLogUniform ? std::log(t.b) : 0.0f;
  detail::fill_tensor(
      t.type, t.ne, s.seed, index, s.threads,
      [&](int64_t r, detail::RowRng& rng, float* v) {
        switch (t.init) {
          case Init::Gaussian:
            for (int64_t i = 0; i < n0; ++i) v[i] = t.a * rng.normal();
            break;
          case Init::Gain:
            for (int64_t i = 0; i < n0; ++i) v[i] = 1.0f + t.a * rng.normal();
            break;
          case Init::Uniform:
            for (int64_t i = 0; i < n0; ++i) v[i] = t.a + (t.b - t.a) * rng.uniform();
            break;
          case Init::NegLogUniform:
            for (int64_t i = 0; i < n0; ++i) {
              v[i] = -std::exp(log_a + (log_b - log_a) * rng.uniform());
            }
            break;
        }
        if (s.skew > 0 && t.role == Role::Embedding) v[0] = detail::kMassive;
        if (s.skew > 0 && t.role == Role::Router) {
          const auto& ranks = rank[static_cast<size_t>(t.layer)];
          if (static_cast<size_t>(r) < ranks.size()) {  // `mutate` may have changed the shape
            v[0] = detail::skew_router_weight(s.skew, ranks[static_cast<size_t>(r)], n0);
          }
        }
      },
      dst);
}

}  // namespace

Qwen35MoeSpec qwen35moe_preset(const std::string& name) {
  Qwen35MoeSpec s;
  if (name == "tiny-qwen35moe") return s;
  if (name == "qwen3.6-35b-a3b") {
    s.n_layer = 40;
    s.full_attn_interval = 4;
    s.n_embd = 2048;
    s.n_head = 16;
    s.n_head_kv = 2;
    s.head_dim = 256;
    s.n_rot = 64;
    s.rope_sections = {11, 11, 10, 0};
    s.rope_base = 1e7f;
    s.ssm_n_k_heads = 16;
    s.ssm_n_v_heads = 32;
    s.ssm_head_dim = 128;
    s.ssm_conv_kernel = 4;
    s.n_expert = 256;
    s.n_expert_used = 8;
    s.n_ff = 512;
    s.n_ff_shexp = 512;
    s.n_ctx = 262144;
    s.n_vocab = 248320;
    return s;
  }
  throw Error("unknown qwen35moe preset '" + name + "' (known: tiny-qwen35moe, qwen3.6-35b-a3b)");
}

bool is_qwen35moe_preset(const std::string& name) {
  return name == "tiny-qwen35moe" || name == "qwen3.6-35b-a3b";
}

GgmlType tensor_type_for(const Qwen35MoeSpec& s, const std::string& name, int layer, int64_t ne0) {
  GgmlType t = s.wtype;
  if (s.mix == QuantMix::KQuantM) {
    const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
    const bool is_output = name == "output.weight" || (s.tied && name == "token_embd.weight");
    // GDN's attn_qkv is "attn_v-like" for llama-quantize; one per layer, so its counter is the
    // layer index.
    const bool v_like = has("attn_v.") || has("attn_qkv.");
    if (is_output) {
      t = GgmlType::Q6_K;
    } else if (has("ffn_down_exps")) {
      if (t == GgmlType::Q4_K) {
        t = GgmlType::Q5_K;
      } else if (t == GgmlType::Q5_K) {
        t = GgmlType::Q6_K;
      }
    } else if ((v_like || has("ffn_down_shexp")) && detail::use_more_bits(layer, s.n_layer)) {
      t = GgmlType::Q6_K;
    }
  }
  return detail::row_fallback(t, ne0);
}

std::vector<PlannedTensor> plan_qwen35moe(const Qwen35MoeSpec& s) {
  gguf::GgufWriter w;
  const std::vector<TensorSpec> ts = build(s, w);
  std::vector<PlannedTensor> out;
  for (size_t i = 0; i < ts.size(); ++i) {
    out.push_back({ts[i].name, ts[i].type, ts[i].ne, w.tensor_bytes(i)});
  }
  return out;
}

size_t write_qwen35moe(const std::string& path, const Qwen35MoeSpec& s) {
  gguf::GgufWriter w;
  const std::vector<TensorSpec> ts = build(s, w);
  const auto rank = detail::expert_ranks(s.seed, s.n_layer, s.n_expert);
  w.write(path, [&](size_t i, uint8_t* dst, uint64_t) { fill(ts[i], i, s, rank, dst); });
  return ts.size();
}

}  // namespace moe::synth
