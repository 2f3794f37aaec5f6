#include "tools/synth/gptoss_synth.h"

#include <cmath>

#include "common/error.h"
#include "common/gguf_writer.h"

namespace moe::synth {
namespace {

enum class Role { Other, Norm, Embedding, Router };

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  float std;  // Gaussian std (Norm: 1 + small noise)
  int layer = -1;
  Role role = Role::Other;
};

void fill(const TensorSpec& t, size_t index, const GptOssSpec& s,
          const std::vector<std::vector<int>>& rank, uint8_t* dst) {
  const int64_t n0 = t.ne[0];
  detail::fill_tensor(
      t.type, t.ne, s.seed, index, s.threads,
      [&](int64_t r, detail::RowRng& rng, float* v) {
        for (int64_t i = 0; i < n0; ++i) {
          v[i] = t.role == Role::Norm ? 1.0f + 0.1f * rng.normal() : t.std * rng.normal();
        }
        if (s.skew > 0 && t.role == Role::Embedding) v[0] = detail::kMassive;
        if (s.skew > 0 && t.role == Role::Router) {
          const int r_e = rank[static_cast<size_t>(t.layer)][static_cast<size_t>(r)];
          v[0] = detail::skew_router_weight(s.skew, r_e, n0);
        }
      },
      dst);
}

}  // namespace

GptOssSpec gptoss_preset(const std::string& name) {
  GptOssSpec s;
  if (name == "tiny-gpt-oss") return s;
  if (name == "gpt-oss-20b" || name == "gpt-oss-120b") {
    s.n_layer = name == "gpt-oss-20b" ? 24 : 36;
    s.n_embd = 2880;
    s.n_head = 64;
    s.n_head_kv = 8;
    s.head_dim = 64;
    s.n_expert = name == "gpt-oss-20b" ? 32 : 128;
    s.n_expert_used = 4;
    s.n_ff = 2880;
    s.sliding_window = 128;
    s.n_vocab = 201088;
    s.wtype = GgmlType::BF16;
    return s;
  }
  throw Error("unknown gpt-oss preset '" + name +
              "' (known: tiny-gpt-oss, gpt-oss-20b, gpt-oss-120b)");
}

bool is_gptoss_preset(const std::string& name) {
  return name == "tiny-gpt-oss" || name == "gpt-oss-20b" || name == "gpt-oss-120b";
}

size_t write_gptoss(const std::string& path, const GptOssSpec& s) {
  if (s.skew < 0 || !std::isfinite(s.skew)) throw Error("skew must be a finite value >= 0");
  if (s.mix != QuantMix::Uniform) {
    throw Error("gpt-oss files have MXFP4 experts and one type for the rest: no K-quant mix");
  }
  if (s.n_embd % 32 != 0 || s.n_ff % 32 != 0) {
    throw Error("gpt-oss: the embedding and expert widths must be multiples of 32 (MXFP4 blocks)");
  }
  if (s.sliding_window < 1) throw Error("gpt-oss: the sliding window must be at least 1 token");
  gguf::GgufWriter w;
  const std::string a = "gpt-oss.";
  w.set_string("general.architecture", "gpt-oss");
  w.set_string("general.name", s.name);
  w.set_u32("general.file_type", 38);  // llama.cpp's MOSTLY_MXFP4_MOE
  w.set_u32("general.quantization_version", 2);
  w.set_u32(a + "block_count", static_cast<uint32_t>(s.n_layer));
  w.set_u32(a + "context_length", static_cast<uint32_t>(s.n_ctx));
  w.set_u32(a + "embedding_length", static_cast<uint32_t>(s.n_embd));
  w.set_u32(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w.set_u32(a + "attention.head_count", static_cast<uint32_t>(s.n_head));
  w.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  w.set_u32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim));
  w.set_u32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim));
  w.set_f32(a + "rope.freq_base", s.rope_base);
  w.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  w.set_u32(a + "expert_count", static_cast<uint32_t>(s.n_expert));
  w.set_u32(a + "expert_used_count", static_cast<uint32_t>(s.n_expert_used));
  w.set_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w.set_u32(a + "attention.sliding_window", static_cast<uint32_t>(s.sliding_window));
  w.set_string(a + "rope.scaling.type", "yarn");
  w.set_f32(a + "rope.scaling.factor", s.yarn_factor);
  w.set_u32(a + "rope.scaling.original_context_length", static_cast<uint32_t>(s.yarn_original_ctx));
  const int64_t n_vocab = !s.vocab_from.empty() ? detail::copy_tokenizer(w, s.vocab_from)
                          : s.with_tokenizer ? detail::write_byte_tokenizer(w, s.n_vocab, "gpt-4o")
                                             : s.n_vocab;

  const int64_t E = s.n_embd, F = s.n_ff, X = s.n_expert;
  const int64_t q = int64_t{s.n_head} * s.head_dim, kv = int64_t{s.n_head_kv} * s.head_dim;
  const auto inv = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  std::vector<TensorSpec> ts;
  const auto dense = [&](const std::string& name, std::vector<int64_t> ne, float std, int layer,
                         Role role = Role::Other) {
    const GgmlType t = detail::row_fallback(s.wtype, ne[0]);
    ts.push_back({name, t, std::move(ne), std, layer, role});
  };
  const auto f32 = [&](const std::string& name, std::vector<int64_t> ne, float std, int layer,
                       Role role = Role::Other) {
    ts.push_back({name, GgmlType::F32, std::move(ne), std, layer, role});
  };
  const auto experts = [&](const std::string& name, std::vector<int64_t> ne, float std, int l) {
    ts.push_back({name, GgmlType::MXFP4, std::move(ne), std, l, Role::Other});
  };
  dense("token_embd.weight", {E, n_vocab}, 0.5f, -1, Role::Embedding);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    f32(p + "attn_norm.weight", {E}, 0, l, Role::Norm);
    f32(p + "post_attention_norm.weight", {E}, 0, l, Role::Norm);
    dense(p + "attn_q.weight", {E, q}, inv(E), l);
    f32(p + "attn_q.bias", {q}, 0.02f, l);
    dense(p + "attn_k.weight", {E, kv}, inv(E), l);
    f32(p + "attn_k.bias", {kv}, 0.02f, l);
    dense(p + "attn_v.weight", {E, kv}, inv(E), l);
    f32(p + "attn_v.bias", {kv}, 0.02f, l);
    dense(p + "attn_output.weight", {q, E}, 0.5f * inv(q), l);
    f32(p + "attn_output.bias", {E}, 0.02f, l);
    f32(p + "attn_sinks.weight", {s.n_head}, 1.0f, l);
    f32(p + "ffn_gate_inp.weight", {E, X}, inv(E), l, Role::Router);
    f32(p + "ffn_gate_inp.bias", {X}, 0.02f, l);
    experts(p + "ffn_gate_exps.weight", {E, F, X}, inv(E), l);
    f32(p + "ffn_gate_exps.bias", {F, X}, 0.02f, l);
    experts(p + "ffn_up_exps.weight", {E, F, X}, inv(E), l);
    f32(p + "ffn_up_exps.bias", {F, X}, 0.02f, l);
    experts(p + "ffn_down_exps.weight", {F, E, X}, inv(F), l);
    f32(p + "ffn_down_exps.bias", {E, X}, 0.02f, l);
  }
  f32("output_norm.weight", {E}, 0, -1, Role::Norm);
  if (!s.tied) dense("output.weight", {E, n_vocab}, 0.15f, -1);

  std::vector<TensorSpec> kept;
  for (TensorSpec t : ts) {
    bool skip = false;
    if (s.mutate) s.mutate(t.name, t.type, t.ne, skip);
    if (skip) continue;
    w.add_tensor(t.name, t.type, t.ne);
    kept.push_back(std::move(t));
  }
  const auto rank = detail::expert_ranks(s.seed, s.n_layer, s.n_expert);
  w.write(path, [&](size_t i, uint8_t* dst, uint64_t) { fill(kept[i], i, s, rank, dst); });
  return kept.size();
}

}  // namespace moe::synth
