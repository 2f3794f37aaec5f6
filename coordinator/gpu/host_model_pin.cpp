#include "coordinator/gpu/host_model_pin.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "common/error.h"

namespace moe::gpu {
namespace {

// Regions this process has page-locked, with how many HostModelPins use each: two models on one
// loaded file (a health probe beside the served model, tests) share the lock, and only the last
// one unlocks it. The driver would refuse a second registration of the same memory.
std::mutex g_mutex;
std::map<void*, int>& g_users() {
  static std::map<void*, int> users;
  return users;
}

const unsigned char* mapped_address(void* host) {
  void* dev = nullptr;
  if (cudaHostGetDevicePointer(&dev, host, 0) != cudaSuccess) {
    (void)cudaGetLastError();  // not a sticky error: the SMs just cannot read it directly
    return nullptr;
  }
  return static_cast<const unsigned char*>(dev);
}

}  // namespace

HostModelPin::HostModelPin(const gguf::GgufFile& file) {
  if (!file.loaded()) {
    throw Error(
        "streaming experts over PCIe needs the model read into memory (-mmp 0, llama.cpp's "
        "--no-mmap): a file mapping cannot be page-locked in reasonable time");
  }
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const std::lock_guard<std::mutex> lock(g_mutex);
  for (const std::span<const uint8_t> s : file.shard_bytes()) {
    if (s.empty()) continue;
    // Loaded shards start on a huge-page boundary and own memory up to the next page boundary.
    const auto begin = reinterpret_cast<uintptr_t>(s.data());
    const uintptr_t end = (begin + s.size() + page - 1) / page * page;
    void* p = reinterpret_cast<void*>(begin);
    const Region region{static_cast<const unsigned char*>(p), end - begin, nullptr};
    if (auto it = g_users().find(p); it != g_users().end()) {
      ++it->second;
      regions_.push_back(region);
      regions_.back().device = mapped_address(p);
      continue;
    }
    // Read-only: the loaded model is mprotect()ed read-only. Mapped: kernels may read it in place.
    const cudaError_t err = cudaHostRegister(
        p, end - begin,
        cudaHostRegisterMapped | cudaHostRegisterPortable | cudaHostRegisterReadOnly);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // not a sticky error
      refusal_ = cudaGetErrorString(err);
      release();
      return;
    }
    g_users()[p] = 1;
    regions_.push_back(region);
    regions_.back().device = mapped_address(p);
  }
  if (regions_.empty()) refusal_ = "the model has no bytes to lock";
}

HostModelPin::~HostModelPin() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  release();
}

const void* HostModelPin::device_view(const void* host) const {
  const auto* b = static_cast<const unsigned char*>(host);
  for (const Region& r : regions_) {
    if (b >= r.host && b < r.host + r.bytes) return r.device ? r.device + (b - r.host) : nullptr;
  }
  return nullptr;
}

void HostModelPin::release() {
  for (const Region& r : regions_) {
    void* p = const_cast<unsigned char*>(r.host);
    const auto it = g_users().find(p);
    if (it != g_users().end() && --it->second == 0) {
      (void)cudaHostUnregister(p);
      g_users().erase(it);
    }
  }
  regions_.clear();
}

}  // namespace moe::gpu
