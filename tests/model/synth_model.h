// Writes small random-weight qwen3moe GGUFs in-process for model tests: any shape, weight type
// f32/f16/bf16/q8_0, and a hook to corrupt the tensor table (drop a tensor, change a shape/type).
#pragma once

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "common/gguf_writer.h"
#include "kernels/cpu/act_quant.h"

namespace moe::test {

struct SynthSpec {
  int n_layer = 2, n_embd = 64, n_head = 4, n_head_kv = 2, head_dim = 32;
  int n_expert = 6, n_expert_used = 2, n_ff = 64, n_vocab = 96, n_ctx = 1024;
  GgmlType wtype = GgmlType::F16;
  bool tied = false;
  uint64_t seed = 7;
  // Called for each tensor before writing; set `skip` to leave it out.
  std::function<void(const std::string& name, GgmlType& type, std::vector<int64_t>& ne, bool& skip)>
      mutate;
};

inline void write_synth(const std::string& path, const SynthSpec& s) {
  struct T {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    float std;  // 0: a norm gain near 1
  };
  const int64_t E = s.n_embd, q = int64_t{s.n_head} * s.head_dim,
                kv = int64_t{s.n_head_kv} * s.head_dim;
  const auto inv = [](int64_t n) { return 1.0f / std::sqrt(static_cast<float>(n)); };
  std::vector<T> ts = {{"token_embd.weight", s.wtype, {E, s.n_vocab}, 0.5f}};
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    ts.push_back({p + "attn_norm.weight", GgmlType::F32, {E}, 0});
    ts.push_back({p + "attn_q.weight", s.wtype, {E, q}, inv(E)});
    ts.push_back({p + "attn_k.weight", s.wtype, {E, kv}, inv(E)});
    ts.push_back({p + "attn_v.weight", s.wtype, {E, kv}, inv(E)});
    ts.push_back({p + "attn_output.weight", s.wtype, {q, E}, 0.5f * inv(q)});
    ts.push_back({p + "attn_q_norm.weight", GgmlType::F32, {s.head_dim}, 0});
    ts.push_back({p + "attn_k_norm.weight", GgmlType::F32, {s.head_dim}, 0});
    ts.push_back({p + "ffn_norm.weight", GgmlType::F32, {E}, 0});
    ts.push_back({p + "ffn_gate_inp.weight", GgmlType::F32, {E, s.n_expert}, inv(E)});
    ts.push_back({p + "ffn_gate_exps.weight", s.wtype, {E, s.n_ff, s.n_expert}, inv(E)});
    ts.push_back({p + "ffn_up_exps.weight", s.wtype, {E, s.n_ff, s.n_expert}, inv(E)});
    ts.push_back({p + "ffn_down_exps.weight", s.wtype, {s.n_ff, E, s.n_expert}, inv(s.n_ff)});
  }
  ts.push_back({"output_norm.weight", GgmlType::F32, {E}, 0});
  if (!s.tied) ts.push_back({"output.weight", s.wtype, {E, s.n_vocab}, 0.15f});

  gguf::GgufWriter w;
  const std::string a = "qwen3moe.";
  w.set_string("general.architecture", "qwen3moe");
  w.set_u32(a + "context_length", static_cast<uint32_t>(s.n_ctx));
  w.set_u32(a + "embedding_length", static_cast<uint32_t>(E));
  w.set_u32(a + "block_count", static_cast<uint32_t>(s.n_layer));
  w.set_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w.set_u32(a + "expert_count", static_cast<uint32_t>(s.n_expert));
  w.set_u32(a + "expert_used_count", static_cast<uint32_t>(s.n_expert_used));
  w.set_u32(a + "attention.head_count", static_cast<uint32_t>(s.n_head));
  w.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  w.set_u32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim));
  w.set_u32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim));
  w.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.set_f32(a + "rope.freq_base", 10000.0f);
  std::vector<T> kept;
  for (T t : ts) {
    bool skip = false;
    if (s.mutate) s.mutate(t.name, t.type, t.ne, skip);
    if (skip) continue;
    w.add_tensor(t.name, t.type, t.ne);
    kept.push_back(t);
  }
  std::mt19937_64 rng(s.seed);
  w.write(path, [&](size_t i, uint8_t* dst, uint64_t n_bytes) {
    const T& t = kept[i];
    int64_t n = 1;
    for (int64_t d : t.ne) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& x : v) x = t.std > 0 ? t.std * normal(rng) : 1.0f + 0.1f * normal(rng);
    switch (t.type) {
      case GgmlType::F32:
        std::memcpy(dst, v.data(), n_bytes);
        break;
      case GgmlType::F16:
      case GgmlType::BF16:
        for (int64_t j = 0; j < n; ++j) {
          const float f = v[static_cast<size_t>(j)];
          const uint16_t h = t.type == GgmlType::F16 ? fp32_to_fp16(f) : fp32_to_bf16(f);
          std::memcpy(dst + 2 * j, &h, 2);
        }
        break;
      case GgmlType::Q8_0:
        cpu::quantize_act_row_ref(cpu::ActFormat::Q8_0, v.data(), dst, n);
        break;
      default:
        std::memset(dst, 0, n_bytes);  // types used only to provoke load errors
    }
  });
}

}  // namespace moe::test
