// The routed experts' live policy on a GPU forward (RoutedExpertsGpu::set_policy, issue 29 §4):
// changed between forwards of one sequence, every change shows in the policy and the per-layer
// split, refusals change nothing, and the logits stay what the same sequence gives unchanged.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
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

std::string policy_model() {
  for (const std::string q : {"Q4_K_M", "F16", "Q8_0", "Q6_K", "Q4_0"}) {
    if (fs::exists(qwen3moe_model_path(q))) return q;
  }
  throw std::runtime_error("no tiny-qwen3moe-sv model in " + moe::test::testdata_dir().string());
}

// Every layer's split adds up to its experts; returns the experts in VRAM and read in place.
std::pair<int64_t, int64_t> check_split(const ModelArch& m) {
  const std::vector<LayerSplit> split = m.layer_split();
  EXPECT_EQ(static_cast<int64_t>(split.size()), m.config().n_layer);
  int64_t vram = 0, direct = 0;
  for (const LayerSplit& l : split) {
    EXPECT_FALSE(l.gpu_home);
    EXPECT_EQ(l.vram + l.direct + l.cpu, m.config().n_expert) << "layer " << l.layer;
    vram += l.vram;
    direct += l.direct;
  }
  return {vram, direct};
}

// -cmoe with every decode miss copied over PCIe (host routing): an expert computes the same on a
// pool slot as on a staging slot, so resizing and regrouping the pool mid-sequence must leave the
// logits bit for bit those of the run that never changed it. Then the stream share goes to auto,
// and to 0 with every miss read in place: routed on the device now, within the golden bounds.
TEST(GpuModel, LivePolicyChangesBetweenForwards) {
  REQUIRE_GPU();
  const fs::path cache = fs::temp_directory_path() / ("moe_policy_cal_" + std::to_string(getpid()));
  ASSERT_EQ(setenv("MOE_CACHE_DIR", cache.c_str(), 1), 0);
  const std::string q = policy_model();
  const auto file =
      moe::gguf::GgufFile::open(qwen3moe_model_path(q).string(), moe::gguf::LoadMode::Loaded);
  moe::cpu::ThreadPool pool(2);
  const fs::path dir = moe::test::testdata_dir() / "golden" / ("tiny-qwen3moe-sv-" + q) / "raw";
  const auto prompt = moe::test::read_raw<int32_t>(dir / "prompt_tokens.i32");
  ASSERT_GE(prompt.size(), 12u);
  GpuOptions opt = options(kPlacements[1]);  // -cmoe, no pool
  opt.moe_stream_share = 1.0;

  // Token by token; before token i, change(i) may change the policy.
  const auto run = [&](ModelArch& m, const std::function<void(size_t)>& change) {
    KvCache kv = m.make_cache(512, KvType::F32, KvType::F32);
    std::vector<float> out, row(static_cast<size_t>(m.config().n_vocab));
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (change) change(i);
      m.forward(std::span<const int32_t>(&prompt[i], 1), kv, LogitsMode::Last, row.data(), nullptr);
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
  };
  Qwen3MoeGpu fixed(file, pool, nullptr, opt);
  const std::vector<float> want = run(fixed, nullptr);

  Qwen3MoeGpu live(file, pool, nullptr, opt);
  ASSERT_TRUE(live.expert_policy());
  EXPECT_EQ(live.expert_policy()->pool_slots, 0);
  EXPECT_EQ(live.expert_policy()->stream_share, 1.0);
  const size_t third = prompt.size() / 3;
  const std::vector<float> pooled = run(live, [&](size_t i) {
    ExpertPolicyChange c;
    if (i == 2) c.pool_mib = 1;
    if (i == third) c.grouping = true;
    if (i == 2 * third) c.pool_mib = 0;
    if (i == 2 * third + 1) c.pool_mib = 2;
    if (c.empty()) return;
    const PolicyOutcome o = live.set_expert_policy(c);
    ASSERT_EQ(o.kind, PolicyOutcome::Applied) << o.message;
    const ExpertPolicy p = *live.expert_policy();
    const auto [vram, direct] = check_split(live);
    EXPECT_EQ(vram, p.pool_filled);
    EXPECT_EQ(direct, 0);
    if (c.pool_mib) {
      EXPECT_EQ(p.pool_bytes, static_cast<uint64_t>(p.pool_slots) * p.slot_bytes);
      EXPECT_EQ(p.pool_slots == 0, *c.pool_mib == 0);
      EXPECT_LE(p.pool_bytes, static_cast<uint64_t>(*c.pool_mib) << 20);
      // Filled from the routing seen so far, right away.
      if (*c.pool_mib > 0) {
        EXPECT_GT(p.pool_filled, 0);
      }
    }
    if (c.grouping) {
      EXPECT_TRUE(p.grouping);
    }
  });
  ASSERT_EQ(pooled.size(), want.size());
  EXPECT_EQ(std::memcmp(pooled.data(), want.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(live.expert_policy()->changes, 4u);
  std::printf("%s\n", live.runtime_stats().c_str());

  // Refused, nothing changed: on this read-in model every change here is possible, so a mapped
  // one and an all-in-VRAM one give the refusals.
  const auto mapped = moe::gguf::GgufFile::open(qwen3moe_model_path(q).string());
  Qwen3MoeGpu on_map(mapped, pool, nullptr, options(kPlacements[1]));
  ExpertPolicyChange stream;
  stream.stream_share = 0.5;
  PolicyOutcome o = on_map.set_expert_policy(stream);
  EXPECT_EQ(o.kind, PolicyOutcome::Unsupported);
  EXPECT_NE(o.message.find("-mmp 0"), std::string::npos) << o.message;
  EXPECT_EQ(on_map.expert_policy()->stream_share, 0);
  EXPECT_EQ(on_map.expert_policy()->changes, 0u);
  Qwen3MoeGpu resident(file, pool, nullptr, options(kPlacements[0]));
  ExpertPolicyChange grow;
  grow.pool_mib = 4;
  o = resident.set_expert_policy(grow);
  EXPECT_EQ(o.kind, PolicyOutcome::Unsupported);
  EXPECT_NE(o.message.find("in VRAM"), std::string::npos) << o.message;
  for (const LayerSplit& l : resident.layer_split()) {
    EXPECT_TRUE(l.gpu_home);
    EXPECT_EQ(l.vram, resident.config().n_expert);
  }

  // Auto, then 0 with every miss read in place (device routing), a new profiler mode, and a
  // recalibration: every change visible, the logits within the golden bounds of the fixed run.
  Qwen3MoeGpu moving(file, pool, nullptr, opt);
  const std::vector<float> moved = run(moving, [&](size_t i) {
    ExpertPolicyChange c;
    if (i == 2) {
      c.stream_share = ExpertPolicy::kAutoShare;
      c.profiler_new = true;
    }
    if (i == third) c.recalibrate = true;
    if (i == 2 * third) {
      c.stream_share = 0;
      c.direct_share = 1;
      c.pool_mib = 1;
    }
    if (c.empty()) return;
    o = moving.set_expert_policy(c);
    ASSERT_EQ(o.kind, PolicyOutcome::Applied) << o.message;
    const ExpertPolicy p = *moving.expert_policy();
    if (i == 2) {
      EXPECT_EQ(p.stream_share, ExpertPolicy::kAutoShare);
      EXPECT_TRUE(p.profiler_new);
      EXPECT_NE(moving.describe().find("decode misses copied over PCIe"), std::string::npos)
          << moving.describe();
    }
    if (i == third) {
      EXPECT_GT(p.recalibrated_ms, 0);
    }
    if (i == 2 * third) {
      EXPECT_EQ(p.direct_share_now, 1.0);
      const auto [vram, direct] = check_split(moving);
      EXPECT_GT(vram, 0);
      EXPECT_EQ(vram + direct, moving.config().n_layer * moving.config().n_expert);
    }
  });
  ASSERT_EQ(moved.size(), want.size());
  Diff d;
  d.add(moved.data(), want.data(), static_cast<int64_t>(want.size()));
  std::printf("auto, then direct reads, against the fixed run: max %.4f rms %.5f\n", d.max,
              d.rms());
  EXPECT_LE(d.rms(), 0.1);
  EXPECT_LE(d.max, 2.0);
  EXPECT_NE(moving.runtime_stats().find("read in place over PCIe by the GPU"), std::string::npos)
      << moving.runtime_stats();
  unsetenv("MOE_CACHE_DIR");
  fs::remove_all(cache);
}

}  // namespace
