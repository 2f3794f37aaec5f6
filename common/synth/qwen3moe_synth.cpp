#include "common/synth/qwen3moe_synth.h"

#include <cmath>
#include <cstring>
#include <random>

#include "common/fp16.h"
#include "common/gguf_writer.h"
#include "kernels/cpu/act_quant.h"

namespace moe::synth {
namespace {

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  float std;  // Gaussian std; 0 for norms (1 + small noise)
};

// GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to U+0100 onwards.
std::vector<std::string> byte_tokens() {
  std::vector<std::string> out(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    out[static_cast<size_t>(b)] = s;
  }
  return out;
}

// Byte tokens, three ChatML specials, [PAD] up to a multiple of 64 and at least n_min.
int64_t write_tokenizer(gguf::GgufWriter& w, int64_t n_min) {
  auto tokens = byte_tokens();
  std::vector<int32_t> types(tokens.size(), 6);  // BYTE
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.emplace_back(special);
    types.push_back(3);  // CONTROL
  }
  while (tokens.size() % 64 != 0 || static_cast<int64_t>(tokens.size()) < n_min) {
    tokens.push_back("[PAD" + std::to_string(tokens.size()) + "]");
    types.push_back(5);  // UNUSED
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "qwen2");
  w.set_strings("tokenizer.ggml.tokens", tokens);
  w.set_i32s("tokenizer.ggml.token_type", types);
  w.set_strings("tokenizer.ggml.merges", {});
  w.set_u32("tokenizer.ggml.bos_token_id", 256);
  w.set_u32("tokenizer.ggml.eos_token_id", 258);
  w.set_u32("tokenizer.ggml.padding_token_id", 256);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  return static_cast<int64_t>(tokens.size());
}

uint32_t file_type_of(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return 0;
    case GgmlType::BF16:
      return 32;
    case GgmlType::Q8_0:
      return 7;
    default:
      return 1;
  }
}

void fill(const TensorSpec& t, uint8_t* dst, uint64_t n_bytes, std::mt19937_64& rng) {
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
      // Weight Q8_0 blocks have the activation Q8_0 layout, so the reference quantizer applies.
      cpu::quantize_act_row_ref(cpu::ActFormat::Q8_0, v.data(), dst, n);
      break;
    default:
      std::memset(dst, 0, n_bytes);  // only reached through `mutate` (tests of load errors)
  }
}

}  // namespace

size_t write_qwen3moe(const std::string& path, const Qwen3MoeSpec& s) {
  gguf::GgufWriter w;
  const std::string a = "qwen3moe.";
  w.set_string("general.architecture", "qwen3moe");
  w.set_string("general.name", s.name);
  w.set_u32("general.file_type", file_type_of(s.wtype));
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
  const int64_t n_vocab = s.with_tokenizer ? write_tokenizer(w, s.n_vocab) : s.n_vocab;

  const int64_t E = s.n_embd, q = int64_t{s.n_head} * s.head_dim,
                kv = int64_t{s.n_head_kv} * s.head_dim;
  const auto inv = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  std::vector<TensorSpec> ts = {{"token_embd.weight", s.wtype, {E, n_vocab}, 0.5f}};
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
  if (!s.tied) ts.push_back({"output.weight", s.wtype, {E, n_vocab}, 0.15f});

  std::vector<TensorSpec> kept;
  for (TensorSpec t : ts) {
    bool skip = false;
    if (s.mutate) s.mutate(t.name, t.type, t.ne, skip);
    if (skip) continue;
    w.add_tensor(t.name, t.type, t.ne);
    kept.push_back(std::move(t));
  }
  std::mt19937_64 rng(s.seed);
  w.write(path, [&](size_t i, uint8_t* dst, uint64_t n) { fill(kept[i], dst, n, rng); });
  return kept.size();
}

}  // namespace moe::synth
