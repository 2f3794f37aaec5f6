// First-fit allocation of byte ranges from [0, size), with freed ranges merged with their free
// neighbours: the places of allocations in a reserved address range, and of small allocations
// inside a chunk of device memory.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <optional>

namespace moe::gpu {

class RangeList {
 public:
  explicit RangeList(uint64_t size) {
    if (size > 0) free_[0] = size;
  }
  // The offset of `bytes` free bytes (the lowest place that fits), now taken; none if no hole
  // is large enough.
  std::optional<uint64_t> take(uint64_t bytes) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      const uint64_t off = it->first, left = it->second - bytes;
      free_.erase(it);
      if (left > 0) free_[off + bytes] = left;
      return off;
    }
    return std::nullopt;
  }
  // Returns [off, off + bytes), which take() gave out.
  void give(uint64_t off, uint64_t bytes) {
    auto ins = free_.emplace(off, bytes).first;
    const auto after = std::next(ins);
    if (after != free_.end() && ins->first + ins->second == after->first) {
      ins->second += after->second;
      free_.erase(after);
    }
    if (ins != free_.begin()) {
      const auto before = std::prev(ins);
      if (before->first + before->second == ins->first) {
        before->second += ins->second;
        free_.erase(ins);
      }
    }
  }

 private:
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes
};

}  // namespace moe::gpu
