// moe-synth: writes a random-weight qwen3moe GGUF with a byte-level vocabulary, for tests,
// benchmarks and the out-of-the-box demo. Shapes come from a preset (overridable); weights are
// Gaussian with std 1/sqrt(fan_in), norms near 1 (common/synth/qwen3moe_synth.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "common/error.h"
#include "common/synth/qwen3moe_synth.h"

int main(int argc, char** argv) {
  CLI::App app{"Write a random-weight qwen3moe GGUF"};
  std::string preset = "tiny", quant = "f16", out;
  moe::synth::Qwen3MoeSpec spec;  // the tiny preset is the spec's defaults
  int layers = 0, n_vocab_min = 0;
  // Shape overrides (0 = the preset's value), so tests can build models of many shapes.
  int n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_expert = 0, n_expert_used = 0;
  int n_ff = 0, n_ctx = 0;
  app.add_option("--preset", preset, "model shapes")->check(CLI::IsMember({"tiny"}));
  app.add_option("--quant", quant, "weight type of the matrices")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  app.add_option("--layers", layers, "override the layer count")->check(CLI::Range(1, 1024));
  app.add_option("--seed", spec.seed, "random seed");
  app.add_option("--n-embd", n_embd, "embedding width")->check(CLI::Range(1, 1 << 16));
  app.add_option("--n-head", n_head, "query heads")->check(CLI::Range(1, 1024));
  app.add_option("--n-head-kv", n_head_kv, "KV heads")->check(CLI::Range(1, 1024));
  app.add_option("--head-dim", head_dim, "head dimension")->check(CLI::Range(2, 1024));
  app.add_option("--n-expert", n_expert, "experts per layer")->check(CLI::Range(1, 1024));
  app.add_option("--n-expert-used", n_expert_used, "experts per token")->check(CLI::Range(1, 1024));
  app.add_option("--n-ff-exp", n_ff, "expert FFN width")->check(CLI::Range(1, 1 << 16));
  app.add_option("--n-ctx", n_ctx, "training context length")->check(CLI::Range(1, 1 << 24));
  app.add_option("--n-vocab", n_vocab_min, "pad the vocabulary with [PAD] tokens up to N")
      ->check(CLI::Range(0, 1 << 20));
  app.add_flag("--tied", spec.tied, "no output.weight (head tied to token_embd)");
  app.add_option("-o,--output", out, "output file")->required();
  CLI11_PARSE(app, argc, argv);

  try {
    for (auto [dst, src] : {std::pair{&spec.n_layer, layers},
                            {&spec.n_embd, n_embd},
                            {&spec.n_head, n_head},
                            {&spec.n_head_kv, n_head_kv},
                            {&spec.head_dim, head_dim},
                            {&spec.n_expert, n_expert},
                            {&spec.n_expert_used, n_expert_used},
                            {&spec.n_ff, n_ff},
                            {&spec.n_ctx, n_ctx}}) {
      if (src > 0) *dst = src;
    }
    if (spec.n_head % spec.n_head_kv != 0) {
      throw moe::Error("--n-head must be a multiple of --n-head-kv");
    }
    if (spec.n_expert_used > spec.n_expert) {
      throw moe::Error("--n-expert-used exceeds --n-expert");
    }
    spec.n_vocab = n_vocab_min;
    spec.wtype = quant == "f32"    ? moe::GgmlType::F32
                 : quant == "bf16" ? moe::GgmlType::BF16
                 : quant == "q8_0" ? moe::GgmlType::Q8_0
                                   : moe::GgmlType::F16;
    spec.name = "moe-synth " + preset;
    const size_t n_tensors = moe::synth::write_qwen3moe(out, spec);
    std::printf("moe-synth: wrote %s (%zu tensors, preset %s, %s, %d layers)\n", out.c_str(),
                n_tensors, preset.c_str(), quant.c_str(), spec.n_layer);
    return 0;
  } catch (const moe::Error& e) {
    std::fprintf(stderr, "moe-synth: error: %s\n", e.what());
    return 1;
  }
}
