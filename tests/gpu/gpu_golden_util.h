// What the GPU model tests share: skipping without a device, the teacher-forced golden run with
// routing forced to llama.cpp's experts, the golden rows it is compared with, and the expert
// placements every model is checked in.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "coordinator/gpu/gpu_options.h"
#include "coordinator/model/forced_routing.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "tests/testdata.h"

namespace moe::test::gpu {

namespace fs = std::filesystem;
using moe::gpu::GpuOptions;
using namespace moe::model;

inline std::string no_device_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  if (n == 0) return "no CUDA device";
  return {};
}

// Prompt logits (every row) then one row per teacher-forced decode step.
inline std::vector<float> run_forced(ModelArch& m, const fs::path& dir, KvType kv) {
  using moe::test::read_raw;
  const auto prompt = read_raw<int32_t>(dir / "prompt_tokens.i32");
  const auto greedy = read_raw<int32_t>(dir / "greedy_tokens.i32");
  const ModelConfig& cfg = m.config();
  ForcedRouting forced(dir.string(), cfg.n_layer, cfg.n_expert_used);
  const ForwardHooks hooks = forced.hooks();
  KvCache cache = m.make_cache(512, kv, kv);
  std::vector<float> out = evaluate_batch(m, cache, prompt, &hooks);
  std::vector<float> row(static_cast<size_t>(cfg.n_vocab));
  for (size_t s = 0; s + 1 < greedy.size(); ++s) {
    m.forward(std::span<const int32_t>(&greedy[s], 1), cache, LogitsMode::Last, row.data(), &hooks);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

inline std::vector<float> golden_rows(const fs::path& dir) {
  using moe::test::read_raw;
  std::vector<float> g = read_raw<float>(dir / "prompt_logits.f32");
  const std::vector<float> greedy = read_raw<float>(dir / "greedy_logits.f32");
  // greedy row 0 is the last prompt row; rows 1.. come from the decode steps.
  const size_t V = greedy.size() / read_raw<int32_t>(dir / "greedy_tokens.i32").size();
  g.insert(g.end(), greedy.begin() + static_cast<std::ptrdiff_t>(V), greedy.end());
  return g;
}

struct Placement {
  const char* name;
  bool cpu_moe;
  int64_t n_cpu_moe;
  int64_t resident_mib;
};
inline const Placement kPlacements[] = {
    {"all experts in VRAM", false, 0, 0},
    {"-cmoe, no pool", true, 0, 0},
    {"-ncmoe 2, 1 MiB pool", false, 2, 1},
};

inline GpuOptions options(const Placement& p) {
  GpuOptions o;
  o.n_gpu_layers = 99;
  o.cpu_moe = p.cpu_moe;
  o.n_cpu_moe = p.n_cpu_moe;
  o.moe_resident_mib = p.resident_mib;
  o.n_ctx = 512;
  return o;
}

}  // namespace moe::test::gpu

#define REQUIRE_GPU()                                             \
  do {                                                            \
    const std::string why = ::moe::test::gpu::no_device_reason(); \
    if (!why.empty()) GTEST_SKIP() << why << " (GPU test)";       \
  } while (0)
