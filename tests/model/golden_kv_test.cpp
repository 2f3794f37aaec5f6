// Quantized KV caches against llama.cpp (../shared/testdata/golden-kv, README there): the shared
// F16 models (head sizes 64 and 256), one prompt batch with the folder's routing forced, our cache
// in the folder's configuration (f16; q8_0 and q4_0 Hadamard-rotated, llama.cpp's default; q4_0 not
// rotated), logits of every position within the README's bounds. The bounds are tight enough that
// a missing or different rotation fails them (llama.cpp's rotated and unrotated q4_0 differ by up
// to 5.2 / 0.52).
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "coordinator/model/forced_routing.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/model/golden_compare.h"
#include "tests/model/golden_driver.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using namespace moe::model;

fs::path model_path(const std::string& model) {
  return model.find("qwen35moe") != std::string::npos
             ? moe::test::qwen35moe_testdata_dir() / "models" / (model + ".gguf")
             : moe::test::testdata_dir() / "models" / (model + ".gguf");
}

class GoldenKv : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenKv, MatchesLlamaCppPerCacheType) {
  const std::string model_name = GetParam();
  const auto file = moe::gguf::GgufFile::open(model_path(model_name).string());
  moe::cpu::ThreadPool pool(2);
  auto model = create_model_arch(file, pool);
  const ModelConfig& cfg = model->config();
  for (const char* prompt : {"raw", "chat"}) {
    for (const moe::test::GoldenKvFolder& c : moe::test::golden_kv_folders()) {
      const fs::path dir = moe::test::testdata_dir() / "golden-kv" / model_name / prompt / c.name;
      SCOPED_TRACE(dir.string());
      const auto tokens = moe::test::read_raw<int32_t>(dir / "prompt_tokens.i32");
      const auto golden = moe::test::read_raw<float>(dir / "prompt_logits.f32");
      ForcedRouting forced(dir.string(), cfg.n_layer, cfg.n_expert_used);
      const ForwardHooks hooks = forced.hooks();
      KvCache cache = model->make_cache(512, c.kv);
      const std::vector<float> ours = evaluate_batch(*model, cache, tokens, &hooks);
      ASSERT_EQ(ours.size(), golden.size());
      moe::test::Diff d;
      d.add(ours.data(), golden.data(), static_cast<int64_t>(golden.size()));
      std::printf("[golden-kv] %-22s %-4s %-10s max %.4f rms %.5f\n", model_name.c_str(), prompt,
                  c.name, d.max, d.rms());
      EXPECT_LE(d.max, c.max);
      EXPECT_LE(d.rms(), c.rms);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SharedF16Models, GoldenKv,
                         ::testing::Values("tiny-qwen3moe-sv-F16", "tiny-qwen35moe-sv-F16"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

}  // namespace
