// Random-weight qwen3moe GGUF models of any shape, for moe-synth, tests and benchmarks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/ggml_type.h"
#include "tools/synth/synth_common.h"

namespace moe::synth {

struct Qwen3MoeSpec {
  int n_layer = 2, n_embd = 128, n_head = 4, n_head_kv = 2, head_dim = 32;
  int n_expert = 8, n_expert_used = 2, n_ff = 128, n_ctx = 2048;
  // With a tokenizer: the byte-level vocabulary is padded to a multiple of 64 and at least this.
  // Without one: exactly this many embedding rows.
  int64_t n_vocab = 0;
  bool with_tokenizer = true;
  GgmlType wtype = GgmlType::F16;  // matrices; norms and the router stay F32
  // Uniform: every matrix is wtype. KQuantM: llama-quantize's Q4_K_M/Q5_K_M rules on top of
  // wtype (output.weight and, on "more bits" layers, attn_v and ffn_down_exps are Q6_K).
  // Either way a K-quant on a row length not divisible by 256 falls back as llama-quantize does.
  using Mix = QuantMix;
  Mix mix = Mix::Uniform;
  bool tied = false;  // no output.weight
  uint64_t seed = 1234;
  float rope_base = 1e6f;
  // Expert popularity: 0 = no preference; X > 0 lowers the router logit of the expert of
  // popularity rank r (a random permutation per layer) by about X * ln(1 + r), Zipf-like.
  float skew = 0.0f;
  // Copy every tokenizer.* key (vocabulary, merges, specials, chat template) from this GGUF and
  // size the embedding and output by its vocabulary; empty = the built-in byte-level vocabulary.
  std::string vocab_from;
  int threads = 0;  // weight generation threads; 0 = every core
  std::string name = "moe-synth";
  // Called for each tensor before it is written (tests use it to make broken models); set
  // `skip` to leave the tensor out. Types we cannot generate are written as zeros.
  std::function<void(const std::string& name, GgmlType& type, std::vector<int64_t>& ne, bool& skip)>
      mutate;
};

// Named shapes: "tiny" (the defaults above) and "qwen3-30b-a3b" (Qwen3-30B-A3B: 48 layers, 2048
// wide, 32/4 heads of 128, 128 experts of width 768, 8 used, 151936 tokens). Throws for others.
Qwen3MoeSpec preset(const std::string& name);

// The type a matrix gets under the spec's mix. `layer` is -1 for token_embd and output.
GgmlType tensor_type_for(const Qwen3MoeSpec& spec, const std::string& name, int layer, int64_t ne0);

// Writes the model (temp file + rename); returns the number of tensors. Throws moe::Error.
size_t write_qwen3moe(const std::string& path, const Qwen3MoeSpec& spec);

}  // namespace moe::synth
