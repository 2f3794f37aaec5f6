// moe-synth: writes a random-weight qwen3moe GGUF with a byte-level vocabulary, for tests,
// benchmarks and the out-of-the-box demo. Shapes come from a preset; weights are Gaussian with
// std 1/sqrt(fan_in), norms near 1.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "common/gguf_writer.h"
#include "kernels/cpu/act_quant.h"

namespace {

using moe::GgmlType;

struct Shape {
  int n_layer, n_embd, n_head, n_head_kv, head_dim, n_expert, n_expert_used, n_ff_exp, n_ctx;
};

constexpr Shape kTiny = {2, 128, 4, 2, 32, 8, 2, 128, 2048};

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

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  float std;  // Gaussian std; 0 for norms (1 + small noise)
};

void fill_tensor(const TensorSpec& t, uint8_t* dst, uint64_t n_bytes, std::mt19937_64& rng) {
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
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = t.type == GgmlType::F16 ? moe::fp32_to_fp16(v[static_cast<size_t>(i)])
                                                   : moe::fp32_to_bf16(v[static_cast<size_t>(i)]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      break;
    case GgmlType::Q8_0:
      // Weight Q8_0 blocks have the activation Q8_0 layout, so the reference quantizer applies.
      moe::cpu::quantize_act_row_ref(moe::cpu::ActFormat::Q8_0, v.data(), dst, n);
      break;
    default:
      throw moe::Error("moe-synth: cannot write type " +
                       moe::ggml_type_label(static_cast<uint32_t>(t.type)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Write a random-weight qwen3moe GGUF"};
  std::string preset = "tiny", quant = "f16", out;
  int layers = 0;
  uint64_t seed = 1234;
  // Shape overrides (0 = the preset's value), so tests can build models of many shapes.
  Shape over = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  int n_vocab_min = 0;
  bool tied = false;
  app.add_option("--preset", preset, "model shapes")->check(CLI::IsMember({"tiny"}));
  app.add_option("--quant", quant, "weight type of the matrices")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  app.add_option("--layers", layers, "override the layer count")->check(CLI::Range(1, 1024));
  app.add_option("--seed", seed, "random seed");
  app.add_option("--n-embd", over.n_embd, "embedding width")->check(CLI::Range(1, 1 << 16));
  app.add_option("--n-head", over.n_head, "query heads")->check(CLI::Range(1, 1024));
  app.add_option("--n-head-kv", over.n_head_kv, "KV heads")->check(CLI::Range(1, 1024));
  app.add_option("--head-dim", over.head_dim, "head dimension")->check(CLI::Range(2, 1024));
  app.add_option("--n-expert", over.n_expert, "experts per layer")->check(CLI::Range(1, 1024));
  app.add_option("--n-expert-used", over.n_expert_used, "experts per token")
      ->check(CLI::Range(1, 1024));
  app.add_option("--n-ff-exp", over.n_ff_exp, "expert FFN width")->check(CLI::Range(1, 1 << 16));
  app.add_option("--n-ctx", over.n_ctx, "training context length")->check(CLI::Range(1, 1 << 24));
  app.add_option("--n-vocab", n_vocab_min, "pad the vocabulary with [PAD] tokens up to N")
      ->check(CLI::Range(0, 1 << 20));
  app.add_flag("--tied", tied, "no output.weight (head tied to token_embd)");
  app.add_option("-o,--output", out, "output file")->required();
  CLI11_PARSE(app, argc, argv);

  try {
    Shape s = kTiny;
    if (layers > 0) s.n_layer = layers;
    for (auto [dst, src] : {std::pair{&s.n_embd, over.n_embd},
                            {&s.n_head, over.n_head},
                            {&s.n_head_kv, over.n_head_kv},
                            {&s.head_dim, over.head_dim},
                            {&s.n_expert, over.n_expert},
                            {&s.n_expert_used, over.n_expert_used},
                            {&s.n_ff_exp, over.n_ff_exp},
                            {&s.n_ctx, over.n_ctx}}) {
      if (src > 0) *dst = src;
    }
    if (s.n_head % s.n_head_kv != 0) throw moe::Error("--n-head must be a multiple of --n-head-kv");
    if (s.n_expert_used > s.n_expert) throw moe::Error("--n-expert-used exceeds --n-expert");
    const GgmlType wtype = quant == "f32"    ? GgmlType::F32
                           : quant == "bf16" ? GgmlType::BF16
                           : quant == "q8_0" ? GgmlType::Q8_0
                                             : GgmlType::F16;
    const uint32_t file_type = quant == "f32" ? 0 : quant == "bf16" ? 32 : quant == "q8_0" ? 7 : 1;

    auto tokens = byte_tokens();
    std::vector<int32_t> types(tokens.size(), 6);  // BYTE
    for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
      tokens.emplace_back(special);
      types.push_back(3);  // CONTROL
    }
    while (tokens.size() % 64 != 0 || tokens.size() < static_cast<size_t>(n_vocab_min)) {
      tokens.push_back("[PAD" + std::to_string(tokens.size()) + "]");
      types.push_back(5);  // UNUSED
    }
    const int64_t n_vocab = static_cast<int64_t>(tokens.size());

    moe::gguf::GgufWriter w;
    const std::string a = "qwen3moe.";
    w.set_string("general.architecture", "qwen3moe");
    w.set_string("general.name", "moe-synth " + preset);
    w.set_u32("general.file_type", file_type);
    w.set_u32("general.quantization_version", 2);
    w.set_u32(a + "context_length", static_cast<uint32_t>(s.n_ctx));
    w.set_u32(a + "embedding_length", static_cast<uint32_t>(s.n_embd));
    w.set_u32(a + "block_count", static_cast<uint32_t>(s.n_layer));
    w.set_u32(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff_exp * 3));
    w.set_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.n_ff_exp));
    w.set_u32(a + "expert_count", static_cast<uint32_t>(s.n_expert));
    w.set_u32(a + "expert_used_count", static_cast<uint32_t>(s.n_expert_used));
    w.set_u32(a + "attention.head_count", static_cast<uint32_t>(s.n_head));
    w.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
    w.set_u32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim));
    w.set_u32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim));
    w.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
    w.set_f32(a + "rope.freq_base", 1e6f);
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "qwen2");
    w.set_strings("tokenizer.ggml.tokens", tokens);
    w.set_i32s("tokenizer.ggml.token_type", types);
    w.set_strings("tokenizer.ggml.merges", {});
    w.set_u32("tokenizer.ggml.bos_token_id", 256);
    w.set_u32("tokenizer.ggml.eos_token_id", 258);
    w.set_u32("tokenizer.ggml.padding_token_id", 256);
    w.set_bool("tokenizer.ggml.add_bos_token", false);

    const int64_t q = s.n_head * s.head_dim, kv = s.n_head_kv * s.head_dim;
    const auto inv = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
    std::vector<TensorSpec> specs = {{"token_embd.weight", wtype, {s.n_embd, n_vocab}, 0.5f}};
    for (int l = 0; l < s.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      specs.push_back({p + "attn_norm.weight", GgmlType::F32, {s.n_embd}, 0});
      specs.push_back({p + "attn_q.weight", wtype, {s.n_embd, q}, inv(s.n_embd)});
      specs.push_back({p + "attn_k.weight", wtype, {s.n_embd, kv}, inv(s.n_embd)});
      specs.push_back({p + "attn_v.weight", wtype, {s.n_embd, kv}, inv(s.n_embd)});
      specs.push_back({p + "attn_output.weight", wtype, {q, s.n_embd}, 0.5f * inv(q)});
      specs.push_back({p + "attn_q_norm.weight", GgmlType::F32, {s.head_dim}, 0});
      specs.push_back({p + "attn_k_norm.weight", GgmlType::F32, {s.head_dim}, 0});
      specs.push_back({p + "ffn_norm.weight", GgmlType::F32, {s.n_embd}, 0});
      specs.push_back(
          {p + "ffn_gate_inp.weight", GgmlType::F32, {s.n_embd, s.n_expert}, inv(s.n_embd)});
      specs.push_back(
          {p + "ffn_gate_exps.weight", wtype, {s.n_embd, s.n_ff_exp, s.n_expert}, inv(s.n_embd)});
      specs.push_back(
          {p + "ffn_up_exps.weight", wtype, {s.n_embd, s.n_ff_exp, s.n_expert}, inv(s.n_embd)});
      specs.push_back(
          {p + "ffn_down_exps.weight", wtype, {s.n_ff_exp, s.n_embd, s.n_expert}, inv(s.n_ff_exp)});
    }
    specs.push_back({"output_norm.weight", GgmlType::F32, {s.n_embd}, 0});
    if (!tied) specs.push_back({"output.weight", wtype, {s.n_embd, n_vocab}, 0.15f});
    for (const auto& t : specs) w.add_tensor(t.name, t.type, t.ne);

    std::mt19937_64 rng(seed);
    w.write(out, [&](size_t i, uint8_t* dst, uint64_t n) { fill_tensor(specs[i], dst, n, rng); });
    std::printf("moe-synth: wrote %s (%zu tensors, preset %s, %s, %d layers)\n", out.c_str(),
                specs.size(), preset.c_str(), quant.c_str(), s.n_layer);
    return 0;
  } catch (const moe::Error& e) {
    std::fprintf(stderr, "moe-synth: error: %s\n", e.what());
    return 1;
  }
}
