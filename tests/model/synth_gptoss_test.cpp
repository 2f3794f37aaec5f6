// The gpt-oss synthetic models: the tiny preset's tensor table and gpt-oss.* keys against the
// tiny model of ../shared/testdata-gptoss (made by llama.cpp's gguf-py, so an independent
// layout), its MXFP4 experts decoding to the intended spread, the real presets' shapes, and the
// generator's refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <variant>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/model/kv_cache.h"
#include "coordinator/model/model_arch.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/testdata.h"
#include "tools/synth/gptoss_synth.h"

namespace {

namespace fs = std::filesystem;
using moe::GgmlType;
using moe::synth::GptOssSpec;

std::string temp_path(const std::string& tag) {
  return (fs::temp_directory_path() /
          ("moe_synth_gptoss_" + tag + "_" + std::to_string(::getpid()) + ".gguf"))
      .string();
}

// Equal scalar metadata values (the gpt-oss.* keys hold no arrays).
bool same_scalar(const moe::gguf::Value& a, const moe::gguf::Value& b) {
  if (a.type != b.type || a.v.index() != b.v.index()) return false;
  if (const auto* u = std::get_if<uint64_t>(&a.v)) return *u == std::get<uint64_t>(b.v);
  if (const auto* i = std::get_if<int64_t>(&a.v)) return *i == std::get<int64_t>(b.v);
  if (const auto* d = std::get_if<double>(&a.v)) return *d == std::get<double>(b.v);
  if (const auto* t = std::get_if<bool>(&a.v)) return *t == std::get<bool>(b.v);
  if (const auto* sv = std::get_if<std::string_view>(&a.v)) {
    return *sv == std::get<std::string_view>(b.v);
  }
  return false;
}

fs::path golden_tiny() {
  return moe::test::gptoss_testdata_dir() / "models" / "tiny-gptoss-MXFP4.gguf";
}

TEST(SynthGptOss, TinyPresetHasTheGoldenModelsLayout) {
  GptOssSpec s = moe::synth::gptoss_preset("tiny-gpt-oss");
  s.vocab_from = golden_tiny().string();  // the same 2,069 tokens, so the same table
  const std::string path = temp_path("tiny");
  moe::synth::write_gptoss(path, s);
  const auto ours = moe::gguf::GgufFile::open(path);
  const auto ref = moe::gguf::GgufFile::open(golden_tiny().string());
  // The same tensors by name (the order in the file is free), each of the same type and shape.
  ASSERT_EQ(ours.tensors().size(), ref.tensors().size());
  for (const auto& b : ref.tensors()) {
    const moe::gguf::TensorInfo* a = ours.find_tensor(b.name);
    ASSERT_NE(a, nullptr) << b.name;
    EXPECT_EQ(a->type_id, b.type_id) << b.name;
    EXPECT_EQ(a->n_dims, b.n_dims) << b.name;
    for (int d = 0; d < 4; ++d) EXPECT_EQ(a->ne[d], b.ne[d]) << b.name << " dim " << d;
  }
  int keys = 0;
  for (const auto& kv : ref.metadata()) {
    if (!kv.key.starts_with("gpt-oss.") && kv.key != "general.architecture" &&
        kv.key != "general.file_type") {
      continue;
    }
    ++keys;
    const moe::gguf::Value* v = ours.find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_TRUE(same_scalar(*v, kv.value)) << kv.key;
  }
  EXPECT_EQ(keys, 19);
  fs::remove(path);
}

TEST(SynthGptOss, ExpertsAreMxfp4WithTheIntendedSpread) {
  const GptOssSpec s = moe::synth::gptoss_preset("tiny-gpt-oss");
  const std::string path = temp_path("mxfp4");
  moe::synth::write_gptoss(path, s);
  const auto f = moe::gguf::GgufFile::open(path);
  for (const char* name : {"blk.1.ffn_gate_exps.weight", "blk.3.ffn_down_exps.weight"}) {
    const moe::gguf::TensorInfo* t = f.find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_EQ(t->type(), GgmlType::MXFP4);
    std::vector<float> y(static_cast<size_t>(t->n_elements()));
    moe::cpu::dequantize_row(GgmlType::MXFP4, t->data, y.data(), t->n_elements());
    double sum2 = 0;
    for (float v : y) {
      ASSERT_TRUE(std::isfinite(v));
      sum2 += static_cast<double>(v) * v;
    }
    // Weights of std 1/sqrt(fan_in), fan_in 256 for both (E = F = 256), through a 4-bit grid.
    const double std = std::sqrt(sum2 / static_cast<double>(y.size()));
    EXPECT_NEAR(std, 1.0 / 16.0, 0.1 / 16.0) << name;
    // E8M0 scales of such weights: 2^(e - 128) near amax / 12 (the published files: 118-123).
    for (uint64_t b = 0; b < t->n_bytes; b += 17) {
      ASSERT_GE(t->data[b], 110) << name << " block " << b / 17;
      ASSERT_LE(t->data[b], 124) << name << " block " << b / 17;
    }
  }
  fs::remove(path);
}

// The synthesized model runs on the CPU forward: a prompt longer than the sliding window in one
// batch and then token by token give the same logits (up to the F16 rounding of activations),
// finite and carrying signal; its config reads back as written.
TEST(SynthGptOss, TinyPresetLoadsAndRuns) {
  GptOssSpec s = moe::synth::gptoss_preset("tiny-gpt-oss");
  s.sliding_window = 4;  // well inside the 24-token prompt
  const std::string path = temp_path("run");
  moe::synth::write_gptoss(path, s);
  const auto file = moe::gguf::GgufFile::open(path);
  moe::cpu::ThreadPool pool(2);
  auto model = moe::model::create_model_arch(file, pool);
  const moe::model::ModelConfig& c = model->config();
  EXPECT_EQ(c.arch, "gpt-oss");
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.n_swa, 4);
  EXPECT_TRUE(c.is_swa(0));
  EXPECT_FALSE(c.is_swa(1));
  const int64_t V = c.n_vocab;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back(static_cast<int32_t>((i * 37 + 5) % 250));
  std::vector<float> batch(tokens.size() * static_cast<size_t>(V));
  std::vector<float> single(batch.size());
  {
    moe::model::KvCache cache =
        model->make_cache(64, moe::model::KvType::F32, moe::model::KvType::F32);
    model->forward(tokens, cache, moe::model::LogitsMode::All, batch.data());
  }
  {
    moe::model::KvCache cache =
        model->make_cache(64, moe::model::KvType::F32, moe::model::KvType::F32);
    for (size_t i = 0; i < tokens.size(); ++i) {
      model->forward(std::span<const int32_t>(&tokens[i], 1), cache, moe::model::LogitsMode::Last,
                     single.data() + i * static_cast<size_t>(V));
    }
  }
  double max_d = 0, ss = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    ASSERT_TRUE(std::isfinite(batch[i]) && std::isfinite(single[i])) << i;
    max_d = std::max(max_d, std::fabs(static_cast<double>(batch[i]) - single[i]));
    ss += static_cast<double>(batch[i]) * batch[i];
  }
  const double rms = std::sqrt(ss / static_cast<double>(batch.size()));
  EXPECT_GT(rms, 0.3);
  EXPECT_LT(max_d, 0.05 * std::max(1.0, rms) + 0.05);
  fs::remove(path);
}

TEST(SynthGptOss, RealPresets) {
  const GptOssSpec m = moe::synth::gptoss_preset("gpt-oss-20b");
  EXPECT_EQ(m.n_layer, 24);
  EXPECT_EQ(m.n_embd, 2880);
  EXPECT_EQ(m.n_head, 64);
  EXPECT_EQ(m.n_head_kv, 8);
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_EQ(m.n_expert, 32);
  EXPECT_EQ(m.n_expert_used, 4);
  EXPECT_EQ(m.n_ff, 2880);
  EXPECT_EQ(m.sliding_window, 128);
  EXPECT_EQ(m.n_vocab, 201088);
  EXPECT_EQ(m.wtype, GgmlType::BF16);
  const GptOssSpec l = moe::synth::gptoss_preset("gpt-oss-120b");
  EXPECT_EQ(l.n_layer, 36);
  EXPECT_EQ(l.n_expert, 128);
  EXPECT_EQ(l.n_embd, 2880);
  EXPECT_TRUE(moe::synth::is_gptoss_preset("gpt-oss-120b"));
  EXPECT_FALSE(moe::synth::is_gptoss_preset("qwen3-30b-a3b"));
  EXPECT_THROW(moe::synth::gptoss_preset("gpt-oss-7b"), moe::Error);
}

TEST(SynthGptOss, RefusesWhatTheFormatCannotHold) {
  GptOssSpec s = moe::synth::gptoss_preset("tiny-gpt-oss");
  s.n_ff = 100;  // MXFP4 blocks are 32 wide
  EXPECT_THROW(moe::synth::write_gptoss(temp_path("bad"), s), moe::Error);
  s = moe::synth::gptoss_preset("tiny-gpt-oss");
  s.mix = moe::synth::QuantMix::KQuantM;
  EXPECT_THROW(moe::synth::write_gptoss(temp_path("bad"), s), moe::Error);
  s = moe::synth::gptoss_preset("tiny-gpt-oss");
  s.sliding_window = 0;
  EXPECT_THROW(moe::synth::write_gptoss(temp_path("bad"), s), moe::Error);
}

}  // namespace
