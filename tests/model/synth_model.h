// Small random-weight qwen3moe models written in-process for model tests: any shape, weight type
// f32/f16/bf16/q8_0, and a hook to corrupt the tensor table (drop a tensor, change a shape/type).
// The generator itself is common/synth (shared with moe-synth); these are the tests' defaults.
#pragma once

#include <string>

#include "tools/synth/qwen3moe_synth.h"

namespace moe::test {

struct SynthSpec : synth::Qwen3MoeSpec {
  SynthSpec() {
    n_embd = 64;
    n_expert = 6;
    n_ff = 64;
    n_vocab = 96;
    n_ctx = 1024;
    seed = 7;
    rope_base = 10000.0f;
    with_tokenizer = false;
  }
};

inline void write_synth(const std::string& path, const SynthSpec& s) {
  synth::write_qwen3moe(path, s);
}

}  // namespace moe::test
