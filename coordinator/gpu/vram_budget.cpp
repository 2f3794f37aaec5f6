#include "coordinator/gpu/vram_budget.h"

#include <cuda_runtime.h>

#include <utility>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {

const char* vram_use_name(VramUse u) {
  switch (u) {
    case VramUse::Weights:
      return "weights";
    case VramUse::Experts:
      return "experts";
    case VramUse::Pool:
      return "pool";
    case VramUse::Kv:
      return "kv";
    case VramUse::Scratch:
      return "scratch";
  }
  return "?";
}

VramBuffer::~VramBuffer() { release(); }

VramBuffer::VramBuffer(VramBuffer&& o) noexcept
    : owner_(std::exchange(o.owner_, nullptr)),
      use_(o.use_),
      ptr_(std::exchange(o.ptr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}

VramBuffer& VramBuffer::operator=(VramBuffer&& o) noexcept {
  if (this != &o) {
    release();
    owner_ = std::exchange(o.owner_, nullptr);
    use_ = o.use_;
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void VramBuffer::release() noexcept {
  if (ptr_) {
    // A failure here means the context is already broken; nothing useful can be done in a
    // destructor, and the process reports the first error where it happened.
    VramAllocator* a = owner_ ? owner_->allocator_ : nullptr;
    if (a) {
      a->release(ptr_);
    } else {
      (void)cudaFree(ptr_);
    }
    if (owner_) owner_->uncharge(use_, bytes_);
  }
  ptr_ = nullptr;
  owner_ = nullptr;
  bytes_ = 0;
}

VramBuffer VramBudget::allocate(size_t bytes, VramUse use, const std::string& what) {
  if (bytes == 0) throw Error("VRAM allocation of 0 bytes for " + what);
  if (bytes > available()) {
    throw Error("VRAM budget exceeded: " + what + " needs " + std::to_string(mib(bytes + 1048575)) +
                " MiB, " + std::to_string(mib(available())) + " MiB left of " + summary() +
                " (raise --vram-budget-mib, or keep more experts on the CPU with -ncmoe/-cmoe "
                "or a smaller --moe-resident-mib)");
  }
  VramBuffer b;
  if (allocator_) {
    std::string why;
    b.ptr_ = allocator_->allocate(bytes, why);
    if (!b.ptr_) {
      throw Error("VRAM allocation of " + std::to_string(mib(bytes)) + " MiB for " + what +
                  " failed: " + why + " (in use: " + summary() + ")");
    }
  } else if (const cudaError_t err = cudaMalloc(&b.ptr_, bytes); err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free allocation error
    throw Error("cudaMalloc of " + std::to_string(mib(bytes)) + " MiB for " + what +
                " failed: " + cudaGetErrorString(err) + " (in use: " + summary() + ")");
  }
  b.owner_ = this;
  b.use_ = use;
  b.bytes_ = bytes;
  used_ += bytes;
  by_use_[static_cast<size_t>(use)] += bytes;
  return b;
}

void VramBudget::uncharge(VramUse u, size_t bytes) noexcept {
  used_ -= bytes;
  by_use_[static_cast<size_t>(u)] -= bytes;
}

std::string VramBudget::summary() const {
  std::string s = std::to_string(mib(used_)) + " MiB of " + std::to_string(mib(limit_)) + " MiB (";
  for (size_t i = 0; i < kVramUseCount; ++i) {
    if (i) s += ", ";
    s +=
        std::string(vram_use_name(static_cast<VramUse>(i))) + " " + std::to_string(mib(by_use_[i]));
  }
  return s + ")";
}

}  // namespace moe::gpu
