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

}  // namespace moe::cuda
