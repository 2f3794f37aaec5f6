// Everything the runtime allocates on a GPU goes through one VramBudget, so `--vram-budget-mib`
// can emulate a small card on a large one and the runtime can report what it actually uses.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "experts/gpu/gpu_executor.h"

namespace moe::gpu {

enum class VramUse { Weights, Experts, Pool, Kv, Scratch };
inline constexpr size_t kVramUseCount = 5;
const char* vram_use_name(VramUse u);

// A device allocation charged to a budget; freed (and uncharged) on destruction. Move-only.
class VramBuffer {
 public:
  VramBuffer() = default;
  ~VramBuffer();
  VramBuffer(VramBuffer&& o) noexcept;
  VramBuffer& operator=(VramBuffer&& o) noexcept;
  VramBuffer(const VramBuffer&) = delete;
  VramBuffer& operator=(const VramBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  friend class VramBudget;
  void release() noexcept;
  class VramBudget* owner_ = nullptr;
  VramUse use_ = VramUse::Scratch;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class VramBudget {
 public:
  // `limit_bytes` caps the sum of live allocations; the device must be current on this thread.
  // Allocations come from `allocator` (outliving the budget's buffers), or cudaMalloc if null.
  explicit VramBudget(uint64_t limit_bytes, VramAllocator* allocator = nullptr)
      : limit_(limit_bytes), allocator_(allocator) {}
  VramBudget(const VramBudget&) = delete;
  VramBudget& operator=(const VramBudget&) = delete;

  // Allocates `bytes` (> 0) for `what`; throws moe::Error naming it and the budget's state when
  // it would not fit the budget or the device refuses.
  VramBuffer allocate(size_t bytes, VramUse use, const std::string& what);

  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_; }
  uint64_t used(VramUse u) const { return by_use_[static_cast<size_t>(u)]; }
  uint64_t available() const { return limit_ - used_; }
  // "1234 MiB of 6144 MiB (weights 900, experts 0, pool 300, kv 30, scratch 4)".
  std::string summary() const;

 private:
  friend class VramBuffer;
  void uncharge(VramUse u, size_t bytes) noexcept;
  uint64_t limit_;
  VramAllocator* allocator_;
  uint64_t used_ = 0;
  std::array<uint64_t, kVramUseCount> by_use_{};
};

inline uint64_t mib(uint64_t bytes) { return bytes >> 20; }

}  // namespace moe::gpu
