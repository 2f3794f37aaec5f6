// Random-weight gpt-oss GGUF models (OpenAI gpt-oss-20b / 120b shapes), for moe-synth, tests and
// benchmarks: MXFP4 routed experts with biases, biased attention projections, attention sinks,
// the sliding-window and YaRN keys, as the published GGUFs have them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/ggml_type.h"
#include "tools/synth/synth_common.h"

namespace moe::synth {

struct GptOssSpec {
  int n_layer = 4, n_embd = 256, n_head = 8, n_head_kv = 2, head_dim = 64;
  int n_expert = 16, n_expert_used = 4, n_ff = 256, n_ctx = 131072;
  int sliding_window = 8;  // tokens, on the even layers
  // With a tokenizer: the byte-level vocabulary padded to a multiple of 64 and at least this.
  int64_t n_vocab = 0;
  bool with_tokenizer = true;
  // The dense matrices (attention, embeddings, output); the routed experts are always MXFP4.
  GgmlType wtype = GgmlType::F16;
  QuantMix mix = QuantMix::Uniform;  // only Uniform: gpt-oss files have no K-quant mix
  bool tied = false;                 // no output.weight
  uint64_t seed = 1234;
  float rope_base = 150000.0f;
  float yarn_factor = 32.0f;
  int yarn_original_ctx = 4096;
  float skew = 0.0f;  // expert popularity, as Qwen3MoeSpec::skew
  std::string vocab_from;
  int threads = 0;
  std::string name = "moe-synth";
  std::function<void(const std::string& name, GgmlType& type, std::vector<int64_t>& ne, bool& skip)>
      mutate;
};

// "tiny-gpt-oss" (the defaults above: the shapes of ../shared/testdata-gptoss's tiny model),
// "gpt-oss-20b" (24 layers, 2880 wide, 64/8 heads of 64, 32 experts of width 2880, 4 used, window
// 128, 201,088 tokens, BF16 dense matrices) and "gpt-oss-120b" (36 layers, 128 experts). Throws
// for others.
GptOssSpec gptoss_preset(const std::string& name);
bool is_gptoss_preset(const std::string& name);

// Writes the model (temp file + rename); returns the number of tensors. Throws moe::Error.
size_t write_gptoss(const std::string& path, const GptOssSpec& spec);

}  // namespace moe::synth
