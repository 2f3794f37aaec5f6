// The qwen35moe synthetic-model generator (tools/synth/qwen35moe_synth.h): the tiny preset loads
// and runs a numerically sane forward (prompt batch = token by token), its Q4_K_M-like type mix
// (Q5_K routed-expert down projection as in Unsloth's UD files), and the real Qwen3.6-35B-A3B
// preset's metadata, tensor table and size, checked without writing its 20 GB of weights.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/model/model_arch.h"
#include "experts/model_config.h"
#include "tools/synth/qwen35moe_synth.h"

namespace {

namespace fs = std::filesystem;
using moe::GgmlType;
using moe::synth::Qwen35MoeSpec;
using namespace moe::model;

std::string temp_path(const std::string& tag) {
  return (fs::temp_directory_path() /
          ("moe_synth35_" + tag + "_" + std::to_string(::getpid()) + ".gguf"))
      .string();
}

Qwen35MoeSpec q4_k_m(const std::string& preset) {
  Qwen35MoeSpec s = moe::synth::qwen35moe_preset(preset);
  s.wtype = GgmlType::Q4_K;
  s.mix = Qwen35MoeSpec::Mix::KQuantM;
  return s;
}

// The expected type of every tensor in a Q4_K_M-like qwen35moe file of n_layer layers: F32 for
// 1-D tensors, norms, the router and the conv; Q6_K output; Q5_K routed-expert down projection;
// Q6_K attn_v / attn_qkv / ffn_down_shexp on llama-quantize's use_more_bits layers; Q4_K else.
GgmlType expected_type(const std::string& name, const std::vector<int64_t>& ne, int n_layer) {
  const auto has = [&](const char* p) { return name.find(p) != std::string::npos; };
  if (ne.size() == 1 || has("_norm") || has("ffn_gate_inp.") || has("ssm_conv1d")) {
    return GgmlType::F32;
  }
  if (name == "output.weight") return GgmlType::Q6_K;
  if (has("ffn_down_exps")) return GgmlType::Q5_K;
  int layer = -1;
  if (name.starts_with("blk.")) layer = std::stoi(name.substr(4));
  const bool more_bits =
      layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
  if ((has("attn_v.") || has("attn_qkv.") || has("ffn_down_shexp")) && more_bits) {
    return GgmlType::Q6_K;
  }
  return GgmlType::Q4_K;
}

using Routes = std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>>;

// Logits of every token: the first n_prompt in batches of `chunk` (LogitsMode::All), the rest as
// single-token decode steps. Without `replay` every token's experts are recorded into `routes`;
// with it they are forced to the recorded ones (so a near tie cannot turn a summation-order
// difference into another expert).
std::vector<float> run(ModelArch& m, const std::vector<int32_t>& tokens, int64_t n_prompt,
                       int64_t chunk, Routes& routes, bool replay) {
  const int64_t V = m.config().n_vocab, K = m.config().n_expert_used;
  const auto n = static_cast<int64_t>(tokens.size());
  ForwardHooks hooks;
  if (replay) {
    hooks.force_experts = [&](int64_t l, int64_t pos, int32_t* e) {
      const auto& r = routes.at({l, pos});
      std::copy(r.begin(), r.end(), e);
      return true;
    };
  } else {
    hooks.observe_layer = [&](const LayerTrace& t) {
      for (int64_t i = 0; i < t.n_tokens; ++i) {
        routes[{t.layer, t.pos0 + i}].assign(t.experts + i * K, t.experts + (i + 1) * K);
      }
    };
  }
  KvCache cache = m.make_cache(256, KvType::F32, KvType::F32);
  std::vector<float> out(static_cast<size_t>(n * V));
  for (int64_t i = 0; i < n;) {
    const int64_t len = i < n_prompt ? std::min(chunk, n_prompt - i) : 1;
    m.forward(std::span<const int32_t>(tokens.data() + i, static_cast<size_t>(len)), cache,
              i < n_prompt ? LogitsMode::All : LogitsMode::Last, out.data() + i * V, &hooks);
    i += len;
  }
  EXPECT_EQ(cache.n_past(), n);
  return out;
}

TEST(SynthQwen35Moe, TinyPresetLoadsAndRunsSanely) {
  for (const bool quantized : {false, true}) {
    SCOPED_TRACE(quantized ? "q4_k_m" : "f16");
    Qwen35MoeSpec s =
        quantized ? q4_k_m("tiny-qwen35moe") : moe::synth::qwen35moe_preset("tiny-qwen35moe");
    s.skew = 0.5f;
    const std::string path = temp_path(quantized ? "tiny_q4" : "tiny_f16");
    EXPECT_EQ(moe::synth::write_qwen35moe(path, s), 76u);  // as the shared tiny model
    const auto file = moe::gguf::GgufFile::open(path);
    moe::cpu::ThreadPool pool(2);
    auto model = create_model_arch(file, pool);
    EXPECT_EQ(model->name(), "qwen35moe");
    const ModelConfig& c = model->config();
    ASSERT_EQ(c.n_layer, 4);
    for (int64_t l = 0; l < 4; ++l) EXPECT_EQ(c.is_recurrent(l), l != 3) << l;
    EXPECT_EQ(c.n_vocab, 2112);
    EXPECT_EQ(c.ssm_conv_channels(), 1024);

    // A prompt of 48 tokens in one batch and 8 decode steps, against token by token.
    std::vector<int32_t> tokens;
    for (int i = 0; i < 56; ++i) tokens.push_back(static_cast<int32_t>((i * 131 + 17) % 259));
    Routes routes;
    const std::vector<float> batch = run(*model, tokens, 48, 48, routes, false);
    const std::vector<float> single = run(*model, tokens, 48, 1, routes, true);
    double max_d = 0, ss = 0, max_abs = 0;
    bool finite = true;
    for (size_t i = 0; i < batch.size(); ++i) {
      finite = finite && std::isfinite(batch[i]) && std::isfinite(single[i]);
      max_d = std::max(max_d, std::fabs(static_cast<double>(batch[i]) - single[i]));
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(batch[i])));
      ss += static_cast<double>(batch[i]) * batch[i];
    }
    const double rms = std::sqrt(ss / static_cast<double>(batch.size()));
    std::printf("[synth35] tiny %s: logit rms %.3f max %.2f, batch vs token by token max %.2e\n",
                quantized ? "q4_k_m" : "f16", rms, max_abs, max_d);
    EXPECT_TRUE(finite);
    EXPECT_GT(rms, 0.3);        // the logits carry signal...
    EXPECT_LT(max_abs, 100.0);  // ...and nothing blew up through the recurrence
    // F16 weights round activations to F16, so one-row and batched matmuls may differ in the last
    // bit of an activation; K-quant rows sum in the same order (see qwen35moe_test).
    EXPECT_LE(max_d, quantized ? 1e-3 : 0.03);
    fs::remove(path);
  }
}

TEST(SynthQwen35Moe, TinyQ4KMTypeMix) {
  const std::string path = temp_path("mix");
  moe::synth::write_qwen35moe(path, q4_k_m("tiny-qwen35moe"));
  const auto file = moe::gguf::GgufFile::open(path);
  EXPECT_EQ(file.require_uint("general.file_type"), 15u);
  EXPECT_EQ(file.require_string("tokenizer.ggml.pre"), "qwen35");
  int n_q6 = 0;
  for (const auto& t : file.tensors()) {
    const std::string name(t.name);
    const std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    EXPECT_EQ(t.type_id, static_cast<uint32_t>(expected_type(name, ne, 4))) << name;
    n_q6 += t.type_id == static_cast<uint32_t>(GgmlType::Q6_K);
  }
  // As the shared tiny Q4_K_M model: blk.2.attn_qkv, blk.3.attn_v, ffn_down_shexp of layers 2
  // and 3, and output.
  EXPECT_EQ(n_q6, 5);
  fs::remove(path);
}

TEST(SynthQwen35Moe, RealPresetTensorTableAndSize) {
  const Qwen35MoeSpec s = q4_k_m("qwen3.6-35b-a3b");
  const auto plan = moe::synth::plan_qwen35moe(s);
  // 30 GDN layers of 19 tensors, 10 attention layers of 16, token_embd, output_norm, output.
  ASSERT_EQ(plan.size(), 30u * 19 + 10u * 16 + 3);
  std::map<std::string, std::vector<int64_t>> shape;
  std::map<std::string, GgmlType> type;
  uint64_t total = 0, experts = 0;
  for (const auto& t : plan) {
    shape[t.name] = t.ne;
    type[t.name] = t.type;
    total += t.n_bytes;
    if (t.name.find("_exps") != std::string::npos) experts += t.n_bytes;
    EXPECT_EQ(t.type, expected_type(t.name, t.ne, 40)) << t.name;
  }
  using V = std::vector<int64_t>;
  EXPECT_EQ(shape["token_embd.weight"], (V{2048, 248320}));
  EXPECT_EQ(shape["output.weight"], (V{2048, 248320}));
  // formats.md §4b.
  EXPECT_EQ(shape["blk.0.attn_qkv.weight"], (V{2048, 8192}));
  EXPECT_EQ(shape["blk.0.attn_gate.weight"], (V{2048, 4096}));
  EXPECT_EQ(shape["blk.0.ssm_conv1d.weight"], (V{4, 8192}));
  EXPECT_EQ(shape["blk.0.ssm_dt.bias"], (V{32}));
  EXPECT_EQ(shape["blk.0.ssm_a"], (V{32}));
  EXPECT_EQ(shape["blk.0.ssm_beta.weight"], (V{2048, 32}));
  EXPECT_EQ(shape["blk.0.ssm_alpha.weight"], (V{2048, 32}));
  EXPECT_EQ(shape["blk.0.ssm_norm.weight"], (V{128}));
  EXPECT_EQ(shape["blk.0.ssm_out.weight"], (V{4096, 2048}));
  EXPECT_EQ(shape["blk.39.attn_q.weight"], (V{2048, 8192}));
  EXPECT_EQ(shape["blk.39.attn_k.weight"], (V{2048, 512}));
  EXPECT_EQ(shape["blk.39.attn_v.weight"], (V{2048, 512}));
  EXPECT_EQ(shape["blk.39.attn_output.weight"], (V{4096, 2048}));
  EXPECT_EQ(shape["blk.39.attn_q_norm.weight"], (V{256}));
  EXPECT_EQ(shape["blk.7.post_attention_norm.weight"], (V{2048}));
  EXPECT_EQ(shape["blk.7.ffn_gate_inp.weight"], (V{2048, 256}));
  EXPECT_EQ(shape["blk.7.ffn_gate_exps.weight"], (V{2048, 512, 256}));
  EXPECT_EQ(shape["blk.7.ffn_up_exps.weight"], (V{2048, 512, 256}));
  EXPECT_EQ(shape["blk.7.ffn_down_exps.weight"], (V{512, 2048, 256}));
  EXPECT_EQ(shape["blk.7.ffn_gate_inp_shexp.weight"], (V{2048}));
  EXPECT_EQ(shape["blk.7.ffn_gate_shexp.weight"], (V{2048, 512}));
  EXPECT_EQ(shape["blk.7.ffn_down_shexp.weight"], (V{512, 2048}));
  for (int l = 0; l < 40; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(shape.count(p + "attn_qkv.weight"), (l + 1) % 4 != 0 ? 1u : 0u) << l;
    EXPECT_EQ(shape.count(p + "attn_q.weight"), (l + 1) % 4 == 0 ? 1u : 0u) << l;
  }
  // use_more_bits at 40 layers: 0-4, 7, 10, ..., 34, 35-39.
  EXPECT_EQ(type["blk.4.attn_qkv.weight"], GgmlType::Q6_K);
  EXPECT_EQ(type["blk.5.attn_qkv.weight"], GgmlType::Q4_K);
  EXPECT_EQ(type["blk.7.attn_v.weight"], GgmlType::Q6_K);
  EXPECT_EQ(type["blk.11.attn_v.weight"], GgmlType::Q4_K);
  EXPECT_EQ(type["blk.0.ffn_down_exps.weight"], GgmlType::Q5_K);
  // Unsloth's Qwen3.6-35B-A3B-UD-Q4_K_M is about 21 GB (formats.md §3.2); the routed experts
  // are most of it.
  std::printf("[synth35] qwen3.6-35b-a3b q4_k_m: %zu tensors, %.2f GB (experts %.2f GB)\n",
              plan.size(), static_cast<double>(total) / 1e9, static_cast<double>(experts) / 1e9);
  EXPECT_GT(total, 19'500'000'000ull);
  EXPECT_LT(total, 22'500'000'000ull);
}

// The real preset's metadata (written without weights) reads back as the real model's config.
TEST(SynthQwen35Moe, RealPresetMetadata) {
  Qwen35MoeSpec s = q4_k_m("qwen3.6-35b-a3b");
  // Only token_embd, with 64 rows: ModelConfig reads the vocabulary size from it.
  s.mutate = [](const std::string& name, GgmlType&, std::vector<int64_t>& ne, bool& skip) {
    skip = name != "token_embd.weight";
    if (!skip) ne[1] = 64;
  };
  const std::string path = temp_path("real_meta");
  EXPECT_EQ(moe::synth::write_qwen35moe(path, s), 1u);
  const auto file = moe::gguf::GgufFile::open(path);
  EXPECT_EQ(file.require_string("general.architecture"), "qwen35moe");
  EXPECT_EQ(file.require_array("tokenizer.ggml.tokens").count, 248320u);
  EXPECT_EQ(file.require_string("tokenizer.ggml.pre"), "qwen35");
  const ModelConfig c = ModelConfig::from_gguf(file);
  EXPECT_EQ(c.n_layer, 40);
  EXPECT_EQ(c.n_nextn, 0);
  EXPECT_EQ(c.n_embd, 2048);
  EXPECT_EQ(c.n_ctx_train, 262144);
  for (int64_t l = 0; l < 40; ++l) {
    EXPECT_EQ(c.is_recurrent(l), (l + 1) % 4 != 0) << l;
    EXPECT_EQ(c.n_head[static_cast<size_t>(l)], 16);
    EXPECT_EQ(c.n_head_kv[static_cast<size_t>(l)], 2);
  }
  EXPECT_EQ(c.head_dim_k, 256);
  EXPECT_EQ(c.head_dim_v, 256);
  EXPECT_EQ(c.n_rot, 64);
  EXPECT_EQ(c.rope_sections, (std::array<int64_t, 4>{11, 11, 10, 0}));
  EXPECT_FLOAT_EQ(c.rope_freq_base, 1e7f);
  EXPECT_EQ(c.ssm_n_k_heads, 16);
  EXPECT_EQ(c.ssm_n_v_heads, 32);
  EXPECT_EQ(c.ssm_head_k, 128);
  EXPECT_EQ(c.ssm_inner, 4096);
  EXPECT_EQ(c.ssm_conv_kernel, 4);
  EXPECT_EQ(c.ssm_conv_channels(), 8192);
  EXPECT_EQ(c.n_expert, 256);
  EXPECT_EQ(c.n_expert_used, 8);
  EXPECT_EQ(c.n_ff_exp, 512);
  EXPECT_EQ(c.n_ff_shexp, 512);
  fs::remove(path);
}

// --skew concentrates routing as it does for qwen3moe (synth_test's SynthSkew).
TEST(SynthQwen35Moe, SkewConcentratesRouting) {
  const auto top4_share = [](float skew) {
    Qwen35MoeSpec s = moe::synth::qwen35moe_preset("tiny-qwen35moe");
    s.n_expert = 16;
    s.skew = skew;
    const std::string path = temp_path("skew");
    moe::synth::write_qwen35moe(path, s);
    const auto file = moe::gguf::GgufFile::open(path);
    moe::cpu::ThreadPool pool(2);
    auto model = create_model_arch(file, pool);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 96; ++i) tokens.push_back(static_cast<int32_t>((i * 53 + 7) % 259));
    Routes routes;
    run(*model, tokens, 96, 96, routes, false);
    fs::remove(path);
    double share = 0;
    for (int64_t l = 0; l < 4; ++l) {
      std::vector<int> counts(16);
      for (const auto& [key, experts] : routes) {
        if (key.first != l) continue;
        for (int32_t e : experts) ++counts[static_cast<size_t>(e)];
      }
      std::sort(counts.begin(), counts.end(), std::greater<>());
      share += static_cast<double>(counts[0] + counts[1] + counts[2] + counts[3]) / (96.0 * 2);
    }
    return share / 4;
  };
  const double flat = top4_share(0.0f), skewed = top4_share(1.5f);
  std::printf("[synth35] top-4 of 16 experts take %.0f%% of selections flat, %.0f%% at skew 1.5\n",
              100 * flat, 100 * skewed);
  // Measured 34% and 81% (the mixers' outputs dilute the embedding's massive dimension a little
  // more than in the qwen3moe test's narrower model).
  EXPECT_LT(flat, 0.55);
  EXPECT_GT(skewed, 0.7);
}

// moe-synth's qwen35moe presets: --layers keeps full attention on every 4th layer.
TEST(SynthQwen35Moe, ToolPresetWithLayers) {
  const std::string path = temp_path("tool");
  const std::string bin = std::string(MOE_BIN_DIR) + "/moe-synth";
  ASSERT_EQ(std::system((bin + " --preset tiny-qwen35moe --quant q4_k_m --layers 8 --skew 1 -o " +
                         path + " > /dev/null")
                            .c_str()),
            0);
  {
    const auto file = moe::gguf::GgufFile::open(path);
    EXPECT_EQ(file.require_uint("general.file_type"), 15u);
    moe::cpu::ThreadPool pool(1);
    auto model = create_model_arch(file, pool);
    ASSERT_EQ(model->config().n_layer, 8);
    for (int64_t l = 0; l < 8; ++l) EXPECT_EQ(model->config().is_recurrent(l), l != 3 && l != 7);
    for (const auto& t : file.tensors()) {
      const std::string name(t.name);
      const std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
      EXPECT_EQ(t.type_id, static_cast<uint32_t>(expected_type(name, ne, 8))) << name;
    }
  }
  fs::remove(path);
  // Options that do not apply to the architecture are errors.
  EXPECT_NE(
      std::system(
          (bin + " --preset tiny-qwen35moe --head-dim 32 -o " + path + " 2>/dev/null").c_str()),
      0);
  EXPECT_NE(
      std::system((bin + " --preset tiny --n-ff-shexp 64 -o " + path + " 2>/dev/null").c_str()), 0);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_THROW(moe::synth::qwen35moe_preset("qwen3-30b-a3b"), moe::Error);
}

}  // namespace
