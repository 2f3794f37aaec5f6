// The GPU forwards' quantized and rotated KV caches against llama.cpp
// (../shared/testdata/golden-kv, README there), as tests/model/golden_kv_test.cpp checks the CPU
// path: the F16 shared models, one prompt batch with the folder's routing forced, logits within the
// README's bounds. gpu-check carries a subset of models per call (the machine takes 64 MiB of
// files): a model that is not carried is skipped with its name.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "coordinator/gpu/model_factory.h"
#include "coordinator/model/forced_routing.h"
#include "coordinator/model/generation.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/gpu/gpu_golden_util.h"
#include "tests/model/golden_compare.h"
#include "tests/model/golden_driver.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using namespace moe::model;
using namespace moe::test::gpu;

class GoldenKvGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenKvGpu, MatchesLlamaCppPerCacheType) {
  REQUIRE_GPU();
  const std::string name = GetParam();
  const fs::path model = name.find("qwen35moe") != std::string::npos
                             ? moe::test::qwen35moe_testdata_dir() / "models" / (name + ".gguf")
                             : moe::test::testdata_dir() / "models" / (name + ".gguf");
  const fs::path golden = moe::test::testdata_dir() / "golden-kv" / name;
  if (!fs::exists(model) || !fs::exists(golden)) {
    GTEST_SKIP() << name << " or its golden-kv folder is not in this data set";
  }
  const auto file = moe::gguf::GgufFile::open(model.string());
  moe::cpu::ThreadPool pool(2);
  for (const Placement& p : {kPlacements[0], kPlacements[1]}) {
    auto gpu = moe::gpu::create_model(file, pool, nullptr, options(p), nullptr);
    const ModelConfig& cfg = gpu->config();
    for (const char* prompt : {"raw", "chat"}) {
      for (const moe::test::GoldenKvFolder& f : moe::test::golden_kv_folders()) {
        const fs::path dir = golden / prompt / f.name;
        SCOPED_TRACE(dir.string() + " [" + p.name + "]");
        const auto tokens = moe::test::read_raw<int32_t>(dir / "prompt_tokens.i32");
        const auto want = moe::test::read_raw<float>(dir / "prompt_logits.f32");
        ForcedRouting forced(dir.string(), cfg.n_layer, cfg.n_expert_used);
        const ForwardHooks hooks = forced.hooks();
        KvCache cache = gpu->make_cache(512, f.kv);
        const std::vector<float> got = evaluate_batch(*gpu, cache, tokens, &hooks);
        ASSERT_EQ(got.size(), want.size());
        moe::test::Diff d;
        d.add(got.data(), want.data(), static_cast<int64_t>(want.size()));
        std::printf("[golden-kv gpu] %-22s %-4s %-10s %-22s max %.4f rms %.5f\n", name.c_str(),
                    prompt, f.name, p.name, d.max, d.rms());
        EXPECT_LE(d.max, f.max);
        EXPECT_LE(d.rms(), f.rms);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SharedF16Models, GoldenKvGpu,
                         ::testing::Values("tiny-qwen3moe-sv-F16", "tiny-qwen35moe-sv-F16"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

}  // namespace
