// Routing on the device against the host's routing on the GPU path, qwen3moe: decode steps routed
// per item, batches grouped by expert on fully resident layers, split layers' batches of up to 8
// tokens published to the CPU share; the same logits (and tokens) either way. Skips, saying why,
// without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "coordinator/gpu/qwen3moe_gpu.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/cuda/gpu_test_env.h"
#include "tests/gpu/gpu_golden_util.h"
#include "tests/model/golden_compare.h"

namespace {

using namespace moe::model;
using moe::gpu::GpuOptions;
using moe::gpu::Qwen3MoeGpu;
using moe::test::Diff;
using namespace moe::test::gpu;

// Decode with every expert in VRAM routes on the device (no hooks); with an observing hook the
// host routes. Same logits, greedy tokens and experts either way.
TEST(GpuModel, DeviceRoutingMatchesHostRouting) {
  REQUIRE_GPU();
  const auto file = moe::gguf::GgufFile::open(qwen3moe_model_path(any_qwen3moe_model()).string());
  moe::cpu::ThreadPool pool(2);
  Qwen3MoeGpu gpu(file, pool, nullptr, options(kPlacements[0]));
  const std::vector<int32_t> prompt = {785, 272, 391, 275, 278, 315, 434, 81};
  GenerateOptions opt;
  opt.n_steps = 24;
  opt.keep_logits = true;
  KvCache a = gpu.make_cache(64, KvType::F16, KvType::F16);
  const GenerateResult on_device = generate(gpu, a, prompt, opt);
  ForwardHooks observe;
  int64_t observed = 0;
  observe.observe_layer = [&](const LayerTrace&) { ++observed; };
  opt.hooks = &observe;
  KvCache b = gpu.make_cache(64, KvType::F16, KvType::F16);
  const GenerateResult on_host = generate(gpu, b, prompt, opt);
  EXPECT_GT(observed, 0);
  EXPECT_EQ(on_device.tokens, on_host.tokens);
  Diff d;
  d.add(on_device.logits.data(), on_host.logits.data(),
        static_cast<int64_t>(on_host.logits.size()));
  std::printf("device vs host routing: max %.3g rms %.3g\n", d.max, d.rms());
  EXPECT_LE(d.max, 1e-3);
}

// Device and host routing differ in the last bits of the routing weights (the device's expf, its
// order of sums). Alone that is ~1e-4 on these logits (scale ~9: one token's decode, above), but
// a product that rounds its activations magnifies it wherever a value crosses a rounding step:
// FP16 operands of the tensor-core GEMM (batches over 8 rows; measured 0.004 for a 37-token
// prompt) and the CPU's Q8 activations (experts on the CPU; measured 0.06 for batches of 5-8, as
// GPU and CPU paths differ at 0.3-0.6). A wrong expert, weight or token moves logits by whole
// units.
double routing_tolerance(const Placement& p) { return p.cpu_moe || p.n_cpu_moe > 0 ? 0.15 : 0.02; }

// Batches of more than 4 tokens on layers whose experts are all in VRAM are routed and grouped by
// expert on the GPU: the same logits as the host's routing and grouping (--moe-host-routing), for
// a whole prompt, for chunks of 6 tokens and for the decode steps after them, all in VRAM and with
// two layers split (those route on the host in a batch either way).
TEST(GpuModel, BatchesGroupedOnDeviceMatchHostRouting) {
  REQUIRE_GPU();
  const auto file = moe::gguf::GgufFile::open(qwen3moe_model_path(any_qwen3moe_model()).string());
  moe::cpu::ThreadPool pool(2);
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 37; ++i) prompt.push_back(100 + 37 * i % 700);
  for (const Placement& p : {kPlacements[0], kPlacements[2]}) {
    SCOPED_TRACE(p.name);
    GpuOptions device_opt = options(p);
    device_opt.moe_direct_share = 0;  // as below: the split layers' misses all on the CPU
    GpuOptions host_opt = device_opt;
    host_opt.moe_host_routing = true;
    Qwen3MoeGpu device(file, pool, nullptr, device_opt);
    Qwen3MoeGpu host(file, pool, nullptr, host_opt);
    const int64_t V = device.config().n_vocab;
    for (const size_t chunk : {prompt.size(), size_t{6}}) {
      KvCache a = device.make_cache(64, KvType::F16, KvType::F16);
      KvCache b = host.make_cache(64, KvType::F16, KvType::F16);
      std::vector<float> la(static_cast<size_t>(V) * prompt.size()), lb(la.size());
      for (size_t i = 0; i < prompt.size(); i += chunk) {
        const size_t n = std::min(chunk, prompt.size() - i);
        const std::span<const int32_t> part(prompt.data() + i, n);
        device.forward(part, a, LogitsMode::All, la.data() + i * static_cast<size_t>(V), nullptr);
        host.forward(part, b, LogitsMode::All, lb.data() + i * static_cast<size_t>(V), nullptr);
      }
      Diff d;
      d.add(la.data(), lb.data(), static_cast<int64_t>(la.size()));
      std::printf("%s, chunks of %zu: device vs host grouping max %.3g rms %.3g\n", p.name, chunk,
                  d.max, d.rms());
      EXPECT_LE(d.max, routing_tolerance(p));
      GenerateOptions opt;
      opt.n_steps = 8;
      opt.keep_logits = true;
      const std::vector<int32_t> next = {prompt.back()};
      const GenerateResult ga = generate(device, a, next, opt);
      const GenerateResult gb = generate(host, b, next, opt);
      EXPECT_EQ(ga.tokens, gb.tokens);
    }
  }
}

// Split layers route batches of up to 8 tokens on the device (a draft's verification, several
// sequences' steps): chunks of 5 to 8 tokens give the host routing's logits (--moe-host-routing),
// with every expert on the CPU and with two split layers beside a pool.
TEST(GpuModel, SplitLayersRouteBatchesOfUpTo8OnDevice) {
  REQUIRE_GPU();
  const auto file = moe::gguf::GgufFile::open(qwen3moe_model_path(any_qwen3moe_model()).string());
  moe::cpu::ThreadPool pool(2);
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 26; ++i) prompt.push_back(100 + 37 * i % 700);
  for (const Placement& p : {kPlacements[1], kPlacements[2]}) {
    SCOPED_TRACE(p.name);
    // No expert read in place by the GPU (--moe-direct-share, on by default once the model is
    // page-locked): the device-routed split would compute those on the GPU where the host-routed
    // one gives them to the CPU, and the routing alone is compared here.
    GpuOptions device_opt = options(p);
    device_opt.moe_direct_share = 0;
    GpuOptions host_opt = device_opt;
    host_opt.moe_host_routing = true;
    Qwen3MoeGpu device(file, pool, nullptr, device_opt);
    Qwen3MoeGpu host(file, pool, nullptr, host_opt);
    const auto V = static_cast<size_t>(device.config().n_vocab);
    KvCache a = device.make_cache(64, KvType::F16, KvType::F16);
    KvCache b = host.make_cache(64, KvType::F16, KvType::F16);
    std::vector<float> la(V * prompt.size()), lb(la.size());
    size_t i = 0;
    for (const size_t n : {size_t{5}, size_t{8}, size_t{6}, size_t{7}}) {
      const std::span<const int32_t> part(prompt.data() + i, n);
      device.forward(part, a, LogitsMode::All, la.data() + i * V, nullptr);
      host.forward(part, b, LogitsMode::All, lb.data() + i * V, nullptr);
      i += n;
    }
    Diff d;
    d.add(la.data(), lb.data(), static_cast<int64_t>(la.size()));
    std::printf("%s, batches of 5-8: device vs host routing max %.3g rms %.3g\n", p.name, d.max,
                d.rms());
    EXPECT_LE(d.max, routing_tolerance(p));
  }
}

}  // namespace
