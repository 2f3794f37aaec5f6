#include "coordinator/gpu/gpu_executor_choice.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/error.h"
#include "experts/gpu/remote_gpu_executor.h"

namespace moe::gpu {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Whether an MPS control daemon serves this process: its pipe directory (CUDA_MPS_PIPE_DIRECTORY,
// default /tmp/nvidia-mps) holds the control pipe. Empty when it does, else why not.
std::string mps_missing() {
  if (const std::string why = env("MOE_MPS_UNAVAILABLE"); !why.empty()) {
    return "MPS unavailable: " + why;
  }
  std::string dir = env("CUDA_MPS_PIPE_DIRECTORY");
  if (dir.empty()) dir = "/tmp/nvidia-mps";
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::path(dir) / "control", ec)) {
    return "no MPS daemon (" + dir + "/control is missing; scripts/with-mps starts one)";
  }
  return "";
}

// moe-gpu-worker beside this executable, or $MOE_GPU_WORKER.
std::string worker_path() {
  if (std::string p = env("MOE_GPU_WORKER"); !p.empty()) return p;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "moe-gpu-worker";
  return (self.parent_path() / "moe-gpu-worker").string();
}

}  // namespace

std::unique_ptr<GpuExecutor> make_gpu_executor(const GpuOptions& opt, uint64_t budget_bytes) {
  if (opt.gpu_executor != "process") return std::make_unique<InProcessGpuExecutor>();
  std::string mps = mps_missing();
  // Measuring the time-sliced case is the one reason to run the worker without MPS.
  if (!mps.empty() && env("MOE_GPU_WORKER_WITHOUT_MPS") != "1") {
    return std::make_unique<InProcessGpuExecutor>("--gpu-executor process: " + mps);
  }
  const std::string note = mps.empty() ? "under MPS" : "without MPS: " + mps;
  // Address space is cheap: room for the budget twice over, so freed and regrown buffers fit.
  const uint64_t range = 2 * budget_bytes + (1ull << 30);
  try {
    return std::make_unique<RemoteGpuExecutor>(worker_path(), opt.device, range, note);
  } catch (const Error& e) {
    return std::make_unique<InProcessGpuExecutor>(std::string("--gpu-executor process: ") +
                                                  e.what());
  }
}

}  // namespace moe::gpu
