// Random-weight qwen3moe GGUF models of any shape, for moe-synth, tests and benchmarks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/ggml_type.h"

namespace moe::synth {

struct Qwen3MoeSpec {
  int n_layer = 2, n_embd = 128, n_head = 4, n_head_kv = 2, head_dim = 32;
  int n_expert = 8, n_expert_used = 2, n_ff = 128, n_ctx = 2048;
  // With a tokenizer: the byte-level vocabulary is padded to a multiple of 64 and at least this.
  // Without one: exactly this many embedding rows.
  int64_t n_vocab = 0;
  bool with_tokenizer = true;
  GgmlType wtype = GgmlType::F16;  // matrices; norms and the router stay F32
  bool tied = false;               // no output.weight
  uint64_t seed = 1234;
  float rope_base = 1e6f;
  std::string name = "moe-synth";
  // Called for each tensor before it is written (tests use it to make broken models); set
  // `skip` to leave the tensor out. Types we cannot generate are written as zeros.
  std::function<void(const std::string& name, GgmlType& type, std::vector<int64_t>& ne, bool& skip)>
      mutate;
};

// Writes the model (temp file + rename); returns the number of tensors. Throws moe::Error.
size_t write_qwen3moe(const std::string& path, const Qwen3MoeSpec& spec);

}  // namespace moe::synth
