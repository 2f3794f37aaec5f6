// moe-cuda-info: lists the GPUs the runtime can use (name, compute capability, VRAM).
#include <cstdio>

#include "common/error.h"
#include "kernels/cuda/device_info.h"

int main() {
  try {
    const auto devices = moe::cuda::list_devices();
    if (devices.empty()) {
      std::printf("no CUDA device visible\n");
      return 0;
    }
    for (const auto& d : devices) {
      std::printf("GPU %d: %s, sm_%d%d, %d SMs, %.0f MiB total, %.0f MiB free\n", d.index,
                  d.name.c_str(), d.sm_major, d.sm_minor, d.multiprocessors,
                  static_cast<double>(d.total_bytes) / (1 << 20),
                  static_cast<double>(d.free_bytes) / (1 << 20));
    }
    return 0;
  } catch (const moe::Error& e) {
    std::fprintf(stderr, "moe-cuda-info: error: %s\n", e.what());
    return 1;
  }
}
