// moe-synth: writes a random-weight qwen3moe, qwen35moe or gpt-oss GGUF, for tests, benchmarks and
// the out-of-the-box demo. Shapes come from a preset (overridable); weights are near-Gaussian with
// std 1/sqrt(fan_in), norms near 1; types follow --quant (tools/synth/qwen3moe_synth.h and
// qwen35moe_synth.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>

#include "common/error.h"
#include "tools/synth/gptoss_synth.h"
#include "tools/synth/qwen35moe_synth.h"
#include "tools/synth/qwen3moe_synth.h"

int main(int argc, char** argv) {
  CLI::App app{"Write a random-weight qwen3moe, qwen35moe or gpt-oss GGUF"};
  std::string preset = "tiny", quant, out;
  int layers = 0, n_vocab_min = 0;
  uint64_t seed = 1234;
  float skew = 0.0f;
  std::string vocab_from;
  bool tied = false;
  bool mtp = false;
  // Shape overrides (0 = the preset's value), so tests can build models of many shapes.
  int n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_expert = 0, n_expert_used = 0;
  int n_ff = 0, n_ff_shexp = 0, n_ctx = 0;
  app.add_option("--preset", preset,
                 "model shapes: tiny and qwen3-30b-a3b (qwen3moe), tiny-qwen35moe and "
                 "qwen3.6-35b-a3b (qwen35moe), tiny-gpt-oss, gpt-oss-20b and gpt-oss-120b "
                 "(gpt-oss: MXFP4 experts)")
      ->check(CLI::IsMember({"tiny", "qwen3-30b-a3b", "tiny-qwen35moe", "qwen3.6-35b-a3b",
                             "tiny-gpt-oss", "gpt-oss-20b", "gpt-oss-120b"}));
  app.add_option("--quant", quant,
                 "weights: q4_k_m (llama-quantize's Q4_K_M mix), q4_k, q5_k, q6_k, q5_0, q8_0, "
                 "f16, bf16, f32 (default: f16 for the tiny presets, q4_k_m for the real shapes; "
                 "qwen35moe's q4_k_m has Q5_K ffn_down_exps as Unsloth's UD-Q4_K_M; gpt-oss: the "
                 "type of everything but the experts, which are MXFP4, default bf16, f16 tiny)")
      ->check(CLI::IsMember(
          {"q4_k_m", "q5_k_m", "q4_k", "q5_k", "q6_k", "q5_0", "q8_0", "f16", "bf16", "f32"}));
  app.add_option("--layers", layers,
                 "override the layer count (qwen35moe: full attention stays every 4th layer)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--seed", seed, "random seed");
  app.add_option("--skew", skew,
                 "expert popularity skew: the router logit of popularity rank r drops by X*ln(1+r)")
      ->check(CLI::Range(0.0f, 16.0f));
  app.add_option("--vocab-from", vocab_from,
                 "copy the tokenizer (and chat template) of this GGUF instead of a byte vocabulary")
      ->check(CLI::ExistingFile);
  app.add_option("--n-embd", n_embd, "embedding width")->check(CLI::Range(1, 1 << 16));
  app.add_option("--n-head", n_head, "query heads")->check(CLI::Range(1, 1024));
  app.add_option("--n-head-kv", n_head_kv, "KV heads")->check(CLI::Range(1, 1024));
  app.add_option("--head-dim", head_dim, "head dimension (qwen3moe and gpt-oss presets only)")
      ->check(CLI::Range(2, 1024));
  app.add_option("--n-expert", n_expert, "experts per layer")->check(CLI::Range(1, 1024));
  app.add_option("--n-expert-used", n_expert_used, "experts per token")->check(CLI::Range(1, 1024));
  app.add_option("--n-ff-exp", n_ff, "expert FFN width")->check(CLI::Range(1, 1 << 16));
  app.add_option("--n-ff-shexp", n_ff_shexp, "shared-expert FFN width (qwen35moe presets only)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--n-ctx", n_ctx, "training context length")->check(CLI::Range(1, 1 << 24));
  app.add_option("--n-vocab", n_vocab_min, "pad the vocabulary with [PAD] tokens up to N")
      ->check(CLI::Range(0, 1 << 20));
  app.add_flag("--tied", tied, "no output.weight (head tied to token_embd)");
  app.add_flag("--mtp", mtp,
               "qwen35moe presets: append the multi-token-prediction block the real files carry "
               "(nextn_predict_layers 1)");
  app.add_option("-o,--output", out, "output file")->required();
  CLI11_PARSE(app, argc, argv);

  try {
    using moe::GgmlType;
    using moe::synth::QuantMix;
    const bool gptoss = moe::synth::is_gptoss_preset(preset);
    if (quant.empty()) quant = preset.starts_with("tiny") ? "f16" : gptoss ? "bf16" : "q4_k_m";
    const std::pair<const char*, GgmlType> types[] = {
        {"q4_k", GgmlType::Q4_K}, {"q5_k", GgmlType::Q5_K}, {"q6_k", GgmlType::Q6_K},
        {"q5_0", GgmlType::Q5_0}, {"q8_0", GgmlType::Q8_0}, {"f16", GgmlType::F16},
        {"bf16", GgmlType::BF16}, {"f32", GgmlType::F32}};
    const bool k_mix = quant.ends_with("_m");
    const std::string base = k_mix ? quant.substr(0, quant.size() - 2) : quant;
    GgmlType wtype = GgmlType::F16;
    for (const auto& [label, type] : types) {
      if (base == label) wtype = type;
    }
    const QuantMix mix = k_mix ? QuantMix::KQuantM : QuantMix::Uniform;
    // Shape overrides (0 = keep the preset's value) and the options every preset takes.
    const auto apply_options = [&](auto& spec, std::initializer_list<std::pair<int*, int>> more) {
      for (auto [dst, src] : {std::pair{&spec.n_layer, layers},
                              {&spec.n_embd, n_embd},
                              {&spec.n_head, n_head},
                              {&spec.n_head_kv, n_head_kv},
                              {&spec.n_expert, n_expert},
                              {&spec.n_expert_used, n_expert_used},
                              {&spec.n_ff, n_ff},
                              {&spec.n_ctx, n_ctx}}) {
        if (src > 0) *dst = src;
      }
      for (auto [dst, src] : more) {
        if (src > 0) *dst = src;
      }
      if (spec.n_head % spec.n_head_kv != 0) {
        throw moe::Error("--n-head must be a multiple of --n-head-kv");
      }
      if (spec.n_expert_used > spec.n_expert) {
        throw moe::Error("--n-expert-used exceeds --n-expert");
      }
      if (n_vocab_min > 0) spec.n_vocab = n_vocab_min;
      spec.seed = seed;
      spec.skew = skew;
      spec.vocab_from = vocab_from;
      spec.tied = tied;
      spec.wtype = wtype;
      spec.mix = mix;
      spec.name = "moe-synth " + preset;
    };
    size_t n_tensors = 0;
    int n_layer = 0;
    if (mtp && !moe::synth::is_qwen35moe_preset(preset)) {
      throw moe::Error("--mtp applies to the qwen35moe presets only");
    }
    if (gptoss) {
      if (n_ff_shexp > 0) throw moe::Error("--n-ff-shexp applies to the qwen35moe presets only");
      if (k_mix) throw moe::Error("gpt-oss presets take one type for the non-expert matrices");
      moe::synth::GptOssSpec spec = moe::synth::gptoss_preset(preset);
      apply_options(spec, {{&spec.head_dim, head_dim}});
      n_tensors = moe::synth::write_gptoss(out, spec);
      n_layer = spec.n_layer;
    } else if (moe::synth::is_qwen35moe_preset(preset)) {
      if (head_dim > 0)
        throw moe::Error("--head-dim applies to the qwen3moe and gpt-oss presets only");
      moe::synth::Qwen35MoeSpec spec = moe::synth::qwen35moe_preset(preset);
      apply_options(spec, {{&spec.n_ff_shexp, n_ff_shexp}});
      spec.mtp = mtp;
      n_tensors = moe::synth::write_qwen35moe(out, spec);
      n_layer = spec.n_layer;
    } else {
      if (n_ff_shexp > 0) throw moe::Error("--n-ff-shexp applies to the qwen35moe presets only");
      moe::synth::Qwen3MoeSpec spec = moe::synth::preset(preset);
      apply_options(spec, {{&spec.head_dim, head_dim}});
      n_tensors = moe::synth::write_qwen3moe(out, spec);
      n_layer = spec.n_layer;
    }
    std::printf("moe-synth: wrote %s (%zu tensors, preset %s, %s, %d layers, skew %g)\n",
                out.c_str(), n_tensors, preset.c_str(), quant.c_str(), n_layer,
                static_cast<double>(skew));
    return 0;
  } catch (const moe::Error& e) {
    std::fprintf(stderr, "moe-synth: error: %s\n", e.what());
    return 1;
  }
}
