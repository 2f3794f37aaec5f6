#include "common/synth/qwen3moe_synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/fp16.h"
#include "common/gguf_writer.h"
#include "kernels/cpu/weight_quant.h"

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
  // NORMAL, as in real byte-level BPE vocabularies (llama.cpp reads BYTE as SentencePiece <0xXX>).
  std::vector<int32_t> types(tokens.size(), 1);
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

// Deterministic per-row generator (splitmix64 seeding + xorshift), so rows can be generated in
// parallel and the file does not depend on the thread count.
struct RowRng {
  uint64_t s;
  RowRng(uint64_t seed, uint64_t tensor, uint64_t row) {
    s = seed ^ (tensor * 0x9E3779B97F4A7C15ull) ^ (row * 0xD1B54A32D192ED03ull);
    for (int i = 0; i < 2; ++i) s = mix(s);
    if (s == 0) s = 1;
  }
  static uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  // Approximately N(0,1): the sum of four 16-bit uniforms (Irwin-Hall), centred and scaled.
  // Cheap enough for the billions of weights of a full-size model; the tails stop at +-3.46.
  float normal() {
    const uint64_t r = next();
    const float sum =
        static_cast<float>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
    return (sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
  }
};

// Expert-popularity skew: every token embedding gets a constant "massive activation" in dimension
// 0 (as real LLMs have), so the normalized hidden state has a consistent positive component
// there; router row e then gets a weight in dimension 0 that adds -skew*ln(1 + rank(e)) to that
// expert's logit.
constexpr float kMassive = 8.0f;

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

uint32_t file_type_of(GgmlType t, Qwen3MoeSpec::Mix mix) {
  const bool m = mix == Qwen3MoeSpec::Mix::KQuantM;
  switch (t) {
    case GgmlType::F32:
      return 0;
    case GgmlType::F16:
      return 1;
    case GgmlType::Q8_0:
      return 7;
    case GgmlType::Q5_0:
      return 8;
    case GgmlType::Q4_K:
      return m ? 15 : 14;  // Q4_K_M : Q4_K_S
    case GgmlType::Q5_K:
      return m ? 17 : 16;  // Q5_K_M : Q5_K_S
    case GgmlType::Q6_K:
      return 18;
    case GgmlType::BF16:
      return 32;
    default:
      throw Error("moe-synth cannot write weights of type " +
                  ggml_type_label(static_cast<uint32_t>(t)));
  }
}

GgmlType tensor_type_for(const Qwen3MoeSpec& s, const std::string& name, int layer, int64_t ne0) {
  GgmlType t = s.wtype;
  if (s.mix == Qwen3MoeSpec::Mix::KQuantM) {
    // llama-quantize's use_more_bits(i, n): the first and last eighth and every third between.
    const int n = s.n_layer;
    const bool more_bits =
        layer >= 0 && (layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2);
    const bool is_output = name == "output.weight" || (s.tied && name == "token_embd.weight");
    const bool v_or_down =
        name.find("attn_v.") != std::string::npos || name.find("ffn_down") != std::string::npos;
    if (is_output || (v_or_down && more_bits)) t = GgmlType::Q6_K;
  }
  if (ne0 % 256 != 0) {  // K-quant blocks are 256 wide; llama-quantize's fallbacks
    if (t == GgmlType::Q4_K) t = GgmlType::Q5_0;
    if (t == GgmlType::Q5_K || t == GgmlType::Q6_K) t = GgmlType::Q8_0;
  }
  if (ne0 % 32 != 0 && t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16) {
    t = GgmlType::F16;
  }
  return t;
}

namespace {

void fill(const TensorSpec& t, size_t index, const Qwen3MoeSpec& s,
          const std::vector<std::vector<int>>& rank, uint8_t* dst) {
  const int64_t n0 = t.ne[0];
  int64_t rows = 1;
  for (size_t d = 1; d < t.ne.size(); ++d) rows *= t.ne[d];
  const uint64_t row_bytes = *ggml_row_bytes(t.type, static_cast<uint64_t>(n0));
  const bool quantizable = cpu::can_quantize_weight(t.type);
  // The expected normalized value of dimension 0 (embedding noise has std 0.5).
  const float massive_norm =
      kMassive / std::sqrt((0.25f * static_cast<float>(n0 - 1) + kMassive * kMassive) /
                           static_cast<float>(n0));
  unsigned n_threads = s.threads > 0 ? static_cast<unsigned>(s.threads)
                                     : std::max(1u, std::thread::hardware_concurrency());
  n_threads = static_cast<unsigned>(std::min<int64_t>(n_threads, std::max<int64_t>(1, rows / 64)));
  const auto work = [&](unsigned part) {
    std::vector<float> v(static_cast<size_t>(n0));
    for (int64_t r = part; r < rows; r += n_threads) {
      RowRng rng(s.seed, index, static_cast<uint64_t>(r));
      for (auto& x : v) x = t.std > 0 ? t.std * rng.normal() : 1.0f + 0.1f * rng.normal();
      if (s.skew > 0 && t.role == Role::Embedding) v[0] = kMassive;
      if (s.skew > 0 && t.role == Role::Router) {
        const int r_e = rank[static_cast<size_t>(t.layer)][static_cast<size_t>(r)];
        v[0] = -s.skew * std::log1p(static_cast<float>(r_e)) / massive_norm;
      }
      uint8_t* out = dst + static_cast<uint64_t>(r) * row_bytes;
      if (quantizable) {
        cpu::quantize_weight_row(t.type, v.data(), out, n0);
      } else {
        std::memset(out, 0, row_bytes);  // only reached through `mutate` (tests of load errors)
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned p = 1; p < n_threads; ++p) pool.emplace_back(work, p);
  work(0);
  for (auto& th : pool) th.join();
}

// A random popularity rank for every expert of every layer.
std::vector<std::vector<int>> expert_ranks(const Qwen3MoeSpec& s) {
  std::mt19937_64 rng(s.seed ^ 0x5EEDull);
  std::vector<std::vector<int>> rank(static_cast<size_t>(s.n_layer));
  for (auto& r : rank) {
    r.resize(static_cast<size_t>(s.n_expert));
    std::iota(r.begin(), r.end(), 0);
    std::shuffle(r.begin(), r.end(), rng);
  }
  return rank;
}

// Copies the tokenizer of another GGUF; returns its vocabulary size.
int64_t copy_tokenizer(gguf::GgufWriter& w, const std::string& path) {
  const gguf::GgufFile src = gguf::GgufFile::open(path);
  for (const auto& kv : src.metadata()) {
    if (kv.key.starts_with("tokenizer.")) w.copy_value(std::string(kv.key), kv.value);
  }
  const gguf::Value* tokens = src.find("tokenizer.ggml.tokens");
  if (!tokens || tokens->type != gguf::ValueType::ARRAY) {
    throw Error(path + ": --vocab-from needs a file with tokenizer.ggml.tokens");
  }
  return static_cast<int64_t>(std::get<gguf::ArrayValue>(tokens->v).count);
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
  const int64_t n_vocab = !s.vocab_from.empty() ? copy_tokenizer(w, s.vocab_from)
                          : s.with_tokenizer    ? write_tokenizer(w, s.n_vocab)
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
  const auto rank = expert_ranks(s);
  w.write(path, [&](size_t i, uint8_t* dst, uint64_t) { fill(kept[i], i, s, rank, dst); });
  return kept.size();
}

}  // namespace moe::synth
