// What the GPU model tests share: skipping without a device and the expert placements every model
// is checked in. The golden runs and rows they are compared with (run_forced, golden_rows) are
// tests/model/golden_driver.h's, as for the CPU golden tests.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.h"
#include "coordinator/gpu/gpu_options.h"
#include "coordinator/model/model_arch.h"
#include "experts/expert_executor.h"
#include "tests/testdata.h"

namespace moe::test::gpu {

using moe::gpu::GpuOptions;
using namespace moe::model;

// A shared tiny qwen3moe model of quantization q ("F16", "Q4_K_M", ...).
inline std::filesystem::path qwen3moe_model_path(const std::string& q) {
  return moe::test::testdata_dir() / "models" / ("tiny-qwen3moe-sv-" + q + ".gguf");
}

// The tiny qwen3moe quantizations of the shared data set, and the first one present
// (scripts/gpu-check carries a subset per call).
inline const std::vector<std::string> kQwen3MoeModels = {"F16",    "Q8_0", "Q6_K",   "Q5_K_M",
                                                         "Q4_K_M", "Q4_0", "IQ4_XS", "Q3_K_M",
                                                         "Q2_K",   "Q2_0", "UD-mix"};
inline std::string any_qwen3moe_model() {
  for (const std::string& q : kQwen3MoeModels) {
    if (std::filesystem::exists(qwen3moe_model_path(q))) return q;
  }
  throw std::runtime_error("no tiny-qwen3moe-sv model in " + moe::test::testdata_dir().string());
}

inline std::string no_device_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  if (n == 0) return "no CUDA device";
  return {};
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

// The cache configurations the GPU forwards are checked in against the CPU path (which
// tests/model/golden_kv_test.cpp checks against llama.cpp): f16, q8_0 and q4_0 rotated (the
// default), q4_0 not rotated, and the reference user's -ctk q4_0 -ctv q4_0 -ctv-first q8_0,1
// -ctk-last f16,1 shape of per-layer types; bf16, q5_x, q4_1 and iq4_nl.
struct KvCase {
  const char* name;
  KvConfig kv;
};
inline std::vector<KvCase> kv_cases() {
  KvConfig norot = KvConfig::uniform(KvType::Q4_0, KvType::Q4_0);
  norot.rotate = false;
  KvConfig mixed = KvConfig::uniform(KvType::Q4_0, KvType::Q4_0);
  mixed.v_first = KvConfig::Override{KvType::Q8_0, 1};
  mixed.k_last = KvConfig::Override{KvType::F16, 1};
  return {{"f16", KvConfig::uniform(KvType::F16, KvType::F16)},
          {"q8_0", KvConfig::uniform(KvType::Q8_0, KvType::Q8_0)},
          {"q4_0", KvConfig::uniform(KvType::Q4_0, KvType::Q4_0)},
          {"q4_0 not rotated", norot},
          {"q4_0, q8_0 V first, f16 K last", mixed},
          {"bf16", KvConfig::uniform(KvType::BF16, KvType::BF16)},
          {"q5_0 K, q5_1 V", KvConfig::uniform(KvType::Q5_0, KvType::Q5_1)},
          {"q4_1", KvConfig::uniform(KvType::Q4_1, KvType::Q4_1)},
          {"iq4_nl", KvConfig::uniform(KvType::IQ4_NL, KvType::IQ4_NL)}};
}

// The CPU experts, throwing at one layer when told to: a CPU share that fails mid-forward.
class FailingExecutor : public ExpertExecutor {
 public:
  explicit FailingExecutor(std::unique_ptr<ExpertExecutor> real) : real_(std::move(real)) {}
  void run(int64_t layer, const float* x, int64_t n, std::span<const ExpertItem> items,
           float* out) override {
    if (fail_at >= 0 && layer == fail_at) throw moe::Error("CPU expert worker lost");
    real_->run(layer, x, n, items, out);
  }
  int64_t fail_at = -1;

 private:
  std::unique_ptr<ExpertExecutor> real_;
};

}  // namespace moe::test::gpu

#define REQUIRE_GPU()                                             \
  do {                                                            \
    const std::string why = ::moe::test::gpu::no_device_reason(); \
    if (!why.empty()) GTEST_SKIP() << why << " (GPU test)";       \
  } while (0)
