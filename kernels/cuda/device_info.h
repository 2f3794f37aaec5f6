// What the runtime needs to know about each visible GPU to place work on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  int multiprocessors = 0;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

// Visible devices; empty when the driver reports none. Throws moe::Error on a driver failure
// other than "no device".
std::vector<DeviceInfo> list_devices();

// The architecture this library's kernels run as on the current device, e.g. 90: the virtual
// architecture of the code the driver picked for it. Not the device's compute capability: a card
// without a matching SASS in the build runs the newest PTX that fits it, compiled at load (an
// RTX 4090, sm_89, in a build for 75 and 90 runs compute_75's, 75). Kernels whose sm_80
// instructions are compiled only where __CUDA_ARCH__ >= 800 are chosen by this. Asked once per
// device.
int kernel_arch();

// Streaming multiprocessors of the current device, asked once per device (a driver call per
// launch costs more than a decode step's attention kernel on some hosts).
int sm_count();

}  // namespace moe::cuda
