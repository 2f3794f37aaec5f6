// Page-locks the host memory of a model read into memory (LoadMode::Loaded), so experts streamed
// to the GPU copy at full PCIe speed (55 GB/s pinned against 7-9 GB/s pageable on the H200 host).
// A file mapping is refused: page-locking gigabytes of file pages did not finish in minutes, and a
// copy whose source straddles a locked and an unlocked page fails, so whole shards are locked.
#pragma once

#include <string>
#include <vector>

#include "common/gguf.h"

namespace moe::gpu {

class HostModelPin {
 public:
  // Throws moe::Error when the model is mapped rather than read in. When the driver refuses to
  // lock the memory, nothing stays locked and pinned() is false: copies still work, slower.
  explicit HostModelPin(const gguf::GgufFile& file);
  ~HostModelPin();
  HostModelPin(const HostModelPin&) = delete;
  HostModelPin& operator=(const HostModelPin&) = delete;

  bool pinned() const { return !regions_.empty(); }
  // Why pinned() is false (the driver's message), or empty.
  const std::string& refusal() const { return refusal_; }
  // The address the GPU's kernels read `host` (a byte of the pinned model) at, or nullptr when it
  // is not in a pinned region: the SMs then read the bytes over PCIe themselves, no copy.
  const void* device_view(const void* host) const;

 private:
  void release();  // with the registry's mutex held

  struct Region {
    const unsigned char* host = nullptr;
    size_t bytes = 0;
    const unsigned char* device = nullptr;  // its mapping in the device's address space
  };
  std::vector<Region> regions_;  // page-locked regions this object uses
  std::string refusal_;
};

}  // namespace moe::gpu
