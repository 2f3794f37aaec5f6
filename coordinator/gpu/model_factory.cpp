#include "coordinator/gpu/model_factory.h"

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/error.h"

#ifdef MOE_HAVE_CUDA
#include <cuda_runtime.h>

#include "coordinator/gpu/gpt_oss_gpu.h"
#include "coordinator/gpu/qwen35moe_gpu.h"
#include "coordinator/gpu/qwen3moe_gpu.h"
#endif

namespace moe::gpu {

bool built_with_cuda() {
#ifdef MOE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

// Why -ngl cannot use a GPU here, or "" when it can.
std::string no_gpu_reason() {
#ifdef MOE_HAVE_CUDA
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(err);
  return count > 0 ? "" : "no CUDA device";
#else
  return "this build has no CUDA support (nvcc was not found at configure time)";
#endif
}

}  // namespace

std::unique_ptr<model::ModelArch> create_model(const gguf::GgufFile& file, cpu::ThreadPool& pool,
                                               std::unique_ptr<model::ExpertExecutor> experts,
                                               const GpuOptions& opt, std::string* placement) {
  if (opt.n_gpu_layers > 0) {
    // As llama.cpp: a command written for a GPU still runs without one, on the CPU, with a
    // warning (the GPU-only flags then do nothing).
    if (const std::string why = no_gpu_reason(); !why.empty()) {
      std::fprintf(stderr, "warning: -ngl %lld: %s; running on the CPU\n",
                   static_cast<long long>(opt.n_gpu_layers), why.c_str());
      auto m = model::create_model_arch(file, pool, std::move(experts));
      if (placement)
        *placement = "CPU: every layer and expert on the CPU (-ngl without a GPU: " + why + ")";
      return m;
    }
  }
  const bool gpu_flags =
      opt.cpu_moe || opt.n_cpu_moe > 0 || opt.vram_budget_mib > 0 || opt.moe_resident_mib > 0 ||
      opt.moe_stream_share != 0 || opt.moe_direct_share > 0 ||
      opt.moe_prefill_cpu_share != GpuOptions{}.moe_prefill_cpu_share || !opt.moe_profile.empty() ||
      opt.moe_grouping_layout || opt.recalibrate || opt.gpu_executor == "process";
  if (opt.n_gpu_layers == 0) {
    if (gpu_flags) {
      throw Error(
          "--vram-budget-mib, -cmoe, -ncmoe, --moe-resident-mib, --moe-stream-share, "
          "--moe-direct-share, "
          "--moe-prefill-cpu-share, "
          "--moe-profile, --moe-resident-grouping layout, --recalibrate and --gpu-executor "
          "process need -ngl "
          "(the model runs on the CPU without it)");
    }
    auto m = model::create_model_arch(file, pool, std::move(experts));
    if (placement) *placement = "CPU: every layer and expert on the CPU (-ngl 0)";
    return m;
  }
#ifdef MOE_HAVE_CUDA
  const std::string_view arch = file.require_string("general.architecture");
  if (arch == "qwen3moe") {
    auto m = std::make_unique<Qwen3MoeGpu>(file, pool, std::move(experts), opt);
    if (placement) *placement = m->describe();
    return m;
  }
  if (arch == "qwen35moe") {
    auto m = std::make_unique<Qwen35MoeGpu>(file, pool, std::move(experts), opt);
    if (placement) *placement = m->describe();
    return m;
  }
  if (arch == "gpt-oss") {
    auto m = std::make_unique<GptOssGpu>(file, pool, std::move(experts), opt);
    if (placement) *placement = m->describe();
    return m;
  }
  throw Error("-ngl: the GPU path supports qwen3moe, qwen35moe and gpt-oss, not '" +
              std::string(arch) + "' (use -ngl 0)");
#else
  throw std::logic_error("unreachable: no_gpu_reason() names the missing CUDA support");
#endif
}

}  // namespace moe::gpu
