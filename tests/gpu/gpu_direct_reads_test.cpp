// --moe-direct-share (coordinator/gpu/routed_experts_device_split.cpp): decode misses that the
// GPU's expert kernels read in place from the page-locked model, against the all-in-VRAM model.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "coordinator/gpu/qwen3moe_gpu.h"
#include "coordinator/model/model_arch.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/cuda/gpu_test_env.h"
#include "tests/gpu/gpu_golden_util.h"
#include "tests/model/golden_driver.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using namespace moe::model;
using moe::gpu::GpuOptions;
using moe::gpu::Qwen3MoeGpu;
using moe::test::Diff;
using namespace moe::test::gpu;

// A shared model present (scripts/gpu-check carries a subset of them).
std::string any_model() {
  for (const std::string q : {"Q4_K_M", "F16", "Q8_0", "Q6_K", "Q4_0"}) {
    if (fs::exists(qwen3moe_model_path(q))) return q;
  }
  throw std::runtime_error("no tiny-qwen3moe-sv model in " + moe::test::testdata_dir().string());
}

// --moe-direct-share: decode layers routed on the device send the chosen misses to the GPU's
// kernels, which read them in place from the page-locked model. Reading every expert so (-cmoe,
// no pool, share 1) matches the all-in-VRAM model within the device router's rounding; half of
// them (the CPU computes the rest), and with a pool, stay within the golden bounds. The option
// needs the model read in and device routing. Every token is fed alone: every step decodes.
TEST(GpuModel, DirectReadsMatchResidentExperts) {
  REQUIRE_GPU();
  const std::string q = any_model();
  moe::cpu::ThreadPool pool(2);
  GpuOptions all = options(kPlacements[1]);  // -cmoe, no pool
  all.moe_direct_share = 1.0;
  const auto mapped = moe::gguf::GgufFile::open(qwen3moe_model_path(q).string());
  moe::test::expect_error([&] { Qwen3MoeGpu m(mapped, pool, nullptr, all); }, "-mmp 0");
  const auto file =
      moe::gguf::GgufFile::open(qwen3moe_model_path(q).string(), moe::gguf::LoadMode::Loaded);
  GpuOptions host = all;
  host.moe_host_routing = true;
  moe::test::expect_error([&] { Qwen3MoeGpu m(file, pool, nullptr, host); }, "routed on the GPU");
  const fs::path dir = moe::test::testdata_dir() / "golden" / ("tiny-qwen3moe-sv-" + q) / "raw";
  const auto prompt = moe::test::read_raw<int32_t>(dir / "prompt_tokens.i32");
  const auto one_by_one = [&](ModelArch& m) {
    KvCache cache = m.make_cache(512, KvType::F32, KvType::F32);
    std::vector<float> out, row(static_cast<size_t>(m.config().n_vocab));
    for (const int32_t t : prompt) {
      m.forward(std::span<const int32_t>(&t, 1), cache, LogitsMode::Last, row.data(), nullptr);
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
  };
  Qwen3MoeGpu resident(file, pool, nullptr, options(kPlacements[0]));
  const std::vector<float> want = one_by_one(resident);

  Qwen3MoeGpu direct(file, pool, nullptr, all);
  EXPECT_NE(direct.describe().find("in place from the page-locked model"), std::string::npos)
      << direct.describe();
  const std::vector<float> got = one_by_one(direct);
  ASSERT_EQ(got.size(), want.size());
  Diff d;
  d.add(got.data(), want.data(), static_cast<int64_t>(want.size()));
  std::printf("direct share 1 vs resident: max %.3g\n", d.max);
  EXPECT_LE(d.max, 1e-3);
  std::string st = direct.runtime_stats();
  EXPECT_NE(st.find(" 0.0% on the CPU"), std::string::npos) << st;
  EXPECT_NE(st.find("read in place over PCIe by the GPU"), std::string::npos) << st;

  // The default, auto, reads some misses in place once the model is read in (the calibration
  // measured PCIe), and none while it is mapped.
  Qwen3MoeGpu defaults(file, pool, nullptr, options(kPlacements[1]));
  EXPECT_NE(defaults.describe().find("(auto) of each decode layer's expected misses"),
            std::string::npos)
      << defaults.describe();
  Qwen3MoeGpu on_map(mapped, pool, nullptr, options(kPlacements[1]));
  EXPECT_EQ(on_map.describe().find("in place"), std::string::npos) << on_map.describe();

  for (const int placement : {1, 2}) {
    GpuOptions half = options(kPlacements[placement]);
    half.moe_direct_share = 0.5;
    Qwen3MoeGpu mixed(file, pool, nullptr, half);
    const std::vector<float> mix = one_by_one(mixed);
    Diff dm;
    dm.add(mix.data(), want.data(), static_cast<int64_t>(want.size()));
    std::printf("%s, direct share 0.5 vs resident: max %.4f rms %.5f\n",
                kPlacements[placement].name, dm.max, dm.rms());
    // Routed on the device, not forced: where the CPU's numerics tip a near tie to another
    // expert, one position's logits move further than the golden bound (measured: max 1.33,
    // rms 0.058 on -cmoe); the RMS bound holds every position to the goldens' level.
    EXPECT_LE(dm.max, 2.0);
    EXPECT_LE(dm.rms(), 0.1);
    st = mixed.runtime_stats();
    EXPECT_NE(st.find("read in place over PCIe by the GPU"), std::string::npos) << st;
    EXPECT_EQ(st.find(" 0.0% on the CPU"), std::string::npos) << st;  // the CPU kept some
  }
}

}  // namespace
