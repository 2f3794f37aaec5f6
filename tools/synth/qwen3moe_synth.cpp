#include "tools/synth/qwen3moe_synth.h"

#include <cmath>

#include "common/error.h"
#include "common/gguf_writer.h"

namespace moe::synth {
namespace {

enum class Role { Other, Embedding, Router };

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  float std;  // Gaussian std; 0 for norms (1 + small noise)
  int layer = -1;
  Role role = Role::Other;
};

}  // namespace

Qwen3MoeSpec preset(const std::string& name) {
  Qwen3MoeSpec s;
  if (name == "tiny") return s;
  if (name == "qwen3-30b-a3b") {
    s.n_layer = 48;
    s.n_embd = 2048;
    s.n_head = 32;
    s.n_head_kv = 4;
    s.head_dim = 128;
    s.n_expert = 128;
    s.n_expert_used = 8;
    s.n_ff = 768;
    s.n_ctx = 40960;
    s.n_vocab = 151936;
    s.rope_base = 1e6f;
    return s;
  }
  throw Error("unknown preset '" + name + "' (known: tiny, qwen3-30b-a3b)");
}

GgmlType tensor_type_for(const Qwen3MoeSpec& s, const std::string& name, int layer, int64_t ne0) {
  GgmlType t = s.wtype;
  if (s.mix == Qwen3MoeSpec::Mix::KQuantM) {
    const bool is_output = name == "output.weight" || (s.tied && name == "token_embd.weight");
    const bool v_or_down =
        name.find("attn_v.") != std::string::npos || name.find("ffn_down") != std::string::npos;
    if (is_output || (v_or_down && detail::use_more_bits(layer, s.n_layer))) t = GgmlType::Q6_K;
  }
  return detail::row_fallback(t, ne0);
}

namespace {

void fill(const TensorSpec& t, size_t index, const Qwen3MoeSpec& s,
          const std::vector<std::vector<int>>& rank, uint8_t* dst) {
  const int64_t n0 = t.ne[0];
  detail::fill_tensor(
      t.type, t.ne, s.seed, index, s.threads,
      [&](int64_t r, detail::RowRng& rng, float* v) {
        for (int64_t i = 0; i < n0; ++i) {
          v[i] = t.std > 0 ? t.std * rng.normal() : 1.0f + 0.1f * rng.normal();
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

size_t write_qwen3moe(const std::string& path, const Qwen3MoeSpec& s) {
  if (s.skew < 0 || !std::isfinite(s.skew)) throw Error("skew must be a finite value >= 0");
  gguf::GgufWriter w;
  const std::string a = "qwen3moe.";
  w.set_string("general.architecture", "qwen3moe");
  w.set_string("general.name", s.name);
  w.set_u32("general.file_type", file_type_of(s.wtype, s.mix));
  w.set_u32("general.quantization_version", 2);
  w.set_u32(a + "context_length", static_cast<uint32_t>(s.n_ctx));
  w.set_u32(a + "embedding_length", static_cast<uint32_t>(s.n_embd));
  w.set_u32(a + "block_count", static_cast<uint32_t>(s.n_layer));
  w.set_u32(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff * 3));
  w.set_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w.set_u32(a + "expert_count", static_cast<uint32_t>(s.n_expert));
  w.set_u32(a + "expert_used_count", static_cast<uint32_t>(s.n_expert_used));
  w.set_u32(a + "attention.head_count", static_cast<uint32_t>(s.n_head));
  w.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  w.set_u32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim));
  w.set_u32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim));
  w.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.set_f32(a + "rope.freq_base", s.rope_base);
  const int64_t n_vocab = !s.vocab_from.empty() ? detail::copy_tokenizer(w, s.vocab_from)
                          : s.with_tokenizer ? detail::write_byte_tokenizer(w, s.n_vocab, "qwen2")
                                             : s.n_vocab;

  const int64_t E = s.n_embd, q = int64_t{s.n_head} * s.head_dim,
                kv = int64_t{s.n_head_kv} * s.head_dim;
  const auto inv = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  std::vector<TensorSpec> ts;
  const auto matrix = [&](const std::string& name, std::vector<int64_t> ne, float std, int layer,
                          Role role = Role::Other) {
    ts.push_back({name, tensor_type_for(s, name, layer, ne[0]), std::move(ne), std, layer, role});
  };
  const auto f32 = [&](const std::string& name, std::vector<int64_t> ne, float std, int layer,
                       Role role = Role::Other) {
    ts.push_back({name, GgmlType::F32, std::move(ne), std, layer, role});
  };
  matrix("token_embd.weight", {E, n_vocab}, 0.5f, -1, Role::Embedding);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    f32(p + "attn_norm.weight", {E}, 0, l);
    matrix(p + "attn_q.weight", {E, q}, inv(E), l);
    matrix(p + "attn_k.weight", {E, kv}, inv(E), l);
    matrix(p + "attn_v.weight", {E, kv}, inv(E), l);
    matrix(p + "attn_output.weight", {q, E}, 0.5f * inv(q), l);
    f32(p + "attn_q_norm.weight", {s.head_dim}, 0, l);
    f32(p + "attn_k_norm.weight", {s.head_dim}, 0, l);
    f32(p + "ffn_norm.weight", {E}, 0, l);
    f32(p + "ffn_gate_inp.weight", {E, s.n_expert}, inv(E), l, Role::Router);
    matrix(p + "ffn_gate_exps.weight", {E, s.n_ff, s.n_expert}, inv(E), l);
    matrix(p + "ffn_up_exps.weight", {E, s.n_ff, s.n_expert}, inv(E), l);
    matrix(p + "ffn_down_exps.weight", {s.n_ff, E, s.n_expert}, inv(s.n_ff), l);
  }
  f32("output_norm.weight", {E}, 0, -1);
  if (!s.tied) matrix("output.weight", {E, n_vocab}, 0.15f, -1);

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
