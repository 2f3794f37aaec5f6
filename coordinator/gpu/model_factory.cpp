#include "coordinator/gpu/model_factory.h"

#include <string>
#include <utility>

#include "common/error.h"

#ifdef MOE_HAVE_CUDA
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

std::unique_ptr<model::ModelArch> create_model(const gguf::GgufFile& file, cpu::ThreadPool& pool,
                                               std::unique_ptr<model::ExpertExecutor> experts,
                                               const GpuOptions& opt, std::string* placement) {
  const bool gpu_flags = opt.cpu_moe || opt.n_cpu_moe > 0 || opt.vram_budget_mib > 0 ||
                         opt.moe_resident_mib > 0 || opt.moe_stream_share != 0 ||
                         opt.moe_prefill_cpu_share != GpuOptions{}.moe_prefill_cpu_share ||
                         !opt.moe_profile.empty() || opt.moe_grouping_layout || opt.recalibrate ||
                         opt.gpu_executor == "process";
  if (opt.n_gpu_layers == 0) {
    if (gpu_flags) {
      throw Error(
          "--vram-budget-mib, -cmoe, -ncmoe, --moe-resident-mib, --moe-stream-share, "
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
  throw Error("-ngl: the GPU path supports qwen3moe and qwen35moe, not '" + std::string(arch) +
              "' (use -ngl 0)");
#else
  (void)file;
  (void)pool;
  (void)experts;
  throw Error("-ngl " + std::to_string(opt.n_gpu_layers) +
              ": this build has no CUDA support (nvcc was not found at configure time)");
#endif
}

}  // namespace moe::gpu
