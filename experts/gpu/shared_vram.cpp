#include "experts/gpu/shared_vram.h"

#include <unistd.h>

#include <cstdint>
#include <string>

#include "common/checked_math.h"
#include "common/error.h"
#include "kernels/cuda/driver_api.h"

namespace moe::gpu {
namespace {

using cuda::check_driver;
using cuda::require_driver_function;

// The driver's virtual memory functions, looked up once.
struct Vmm {
  decltype(&cuMemGetAllocationGranularity) granularity =
      require_driver_function<decltype(&cuMemGetAllocationGranularity)>(
          "cuMemGetAllocationGranularity");
  decltype(&cuMemAddressReserve) reserve =
      require_driver_function<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
  decltype(&cuMemAddressFree) address_free =
      require_driver_function<decltype(&cuMemAddressFree)>("cuMemAddressFree");
  decltype(&cuMemCreate) create = require_driver_function<decltype(&cuMemCreate)>("cuMemCreate");
  decltype(&cuMemRelease) release =
      require_driver_function<decltype(&cuMemRelease)>("cuMemRelease");
  decltype(&cuMemMap) map = require_driver_function<decltype(&cuMemMap)>("cuMemMap");
  decltype(&cuMemUnmap) unmap = require_driver_function<decltype(&cuMemUnmap)>("cuMemUnmap");
  decltype(&cuMemSetAccess) set_access =
      require_driver_function<decltype(&cuMemSetAccess)>("cuMemSetAccess");
  decltype(&cuMemExportToShareableHandle) export_handle =
      require_driver_function<decltype(&cuMemExportToShareableHandle)>(
          "cuMemExportToShareableHandle");
  decltype(&cuMemImportFromShareableHandle) import_handle =
      require_driver_function<decltype(&cuMemImportFromShareableHandle)>(
          "cuMemImportFromShareableHandle");
};

const Vmm& vmm() {
  static const Vmm v;
  return v;
}

CUmemAllocationProp allocation_prop(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// v rounded up to the granularity (a power of two); a size that overflows is an error.
uint64_t granules(uint64_t v, uint64_t g) {
  const std::optional<uint64_t> r = checked_align_up(v, g);
  if (!r) throw Error("shared device memory of " + std::to_string(v) + " bytes is too large");
  return *r;
}

}  // namespace

SharedVram::SharedVram(int device, uint64_t bytes, uint64_t at) : device_(device) {
  const Vmm& v = vmm();
  const CUmemAllocationProp prop = allocation_prop(device);
  size_t g = 0;
  check_driver(v.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
               "cuMemGetAllocationGranularity");
  granularity_ = g;
  size_ = granules(bytes, granularity_);
  CUdeviceptr p = 0;
  check_driver(v.reserve(&p, size_, granularity_, static_cast<CUdeviceptr>(at), 0),
               "cuMemAddressReserve");
  base_ = static_cast<uint64_t>(p);
  if (at != 0 && base_ != at) {
    (void)v.address_free(p, size_);
    char msg[160];
    std::snprintf(
        msg, sizeof msg, "the device address range at 0x%llx (%llu MiB) is taken in this process",
        static_cast<unsigned long long>(at), static_cast<unsigned long long>(size_ >> 20));
    throw Error(msg);
  }
  free_ = RangeList(size_);
}

SharedVram::~SharedVram() {
  const Vmm& v = vmm();
  for (const auto& [off, m] : live_) {
    (void)v.unmap(static_cast<CUdeviceptr>(base_ + off), m.bytes);
    (void)v.release(m.handle);
  }
  (void)v.address_free(static_cast<CUdeviceptr>(base_), size_);
}

void SharedVram::map_at(uint64_t offset, uint64_t bytes, CUmemGenericAllocationHandle h,
                        bool created) {
  const Vmm& v = vmm();
  const auto ptr = static_cast<CUdeviceptr>(base_ + offset);
  check_driver(v.map(ptr, bytes, 0, h, 0), "cuMemMap");
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult rc = v.set_access(ptr, bytes, &access, 1);
  if (rc != CUDA_SUCCESS) {
    (void)v.unmap(ptr, bytes);
    check_driver(rc, "cuMemSetAccess");
  }
  live_[offset] = {bytes, h, created};
}

SharedVram::Export SharedVram::create(size_t bytes) {
  const Vmm& v = vmm();
  const std::lock_guard lock(mu_);
  const uint64_t want = granules(bytes == 0 ? 1 : bytes, granularity_);
  const std::optional<uint64_t> place = free_.take(want);
  if (!place) {
    throw Error("the shared device address range (" + std::to_string(size_ >> 20) +
                " MiB) has no free " + std::to_string(want >> 20) + " MiB left");
  }
  const uint64_t offset = *place;
  const CUmemAllocationProp prop = allocation_prop(device_);
  CUmemGenericAllocationHandle h = 0;
  const CUresult created = v.create(&h, want, &prop, 0);
  if (created != CUDA_SUCCESS) {
    free_.give(offset, want);
    check_driver(created, "cuMemCreate");
  }
  int fd = -1;
  CUresult rc = v.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (rc != CUDA_SUCCESS) {
    (void)v.release(h);
    free_.give(offset, want);
    check_driver(rc, "cuMemExportToShareableHandle");
  }
  try {
    map_at(offset, want, h, true);
  } catch (...) {
    ::close(fd);
    (void)v.release(h);
    free_.give(offset, want);
    throw;
  }
  return {reinterpret_cast<void*>(base_ + offset), offset, want, fd};
}

void* SharedVram::import(int fd, uint64_t offset, uint64_t bytes) {
  const Vmm& v = vmm();
  const std::lock_guard lock(mu_);
  if (bytes == 0 || offset % granularity_ != 0 || bytes % granularity_ != 0 || offset > size_ ||
      bytes > size_ - offset) {
    throw Error("shared allocation of " + std::to_string(bytes) + " bytes at offset " +
                std::to_string(offset) + " is outside the shared range or misaligned");
  }
  const auto next = live_.lower_bound(offset);
  const bool overlaps_next = next != live_.end() && next->first < offset + bytes;
  const bool overlaps_prev =
      next != live_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > offset;
  if (overlaps_next || overlaps_prev) {
    throw Error("shared allocation at offset " + std::to_string(offset) +
                " overlaps one already mapped");
  }
  CUmemGenericAllocationHandle h = 0;
  check_driver(v.import_handle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
               "cuMemImportFromShareableHandle");
  try {
    map_at(offset, bytes, h, false);
  } catch (...) {
    (void)v.release(h);
    throw;
  }
  return reinterpret_cast<void*>(base_ + offset);
}

void SharedVram::release(void* p) noexcept {
  const Vmm& v = vmm();
  const std::lock_guard lock(mu_);
  const uint64_t addr = reinterpret_cast<uint64_t>(p);
  if (addr < base_) return;
  const auto it = live_.find(addr - base_);
  if (it == live_.end()) return;
  const uint64_t off = it->first, bytes = it->second.bytes;
  const bool created = it->second.created;
  (void)v.unmap(static_cast<CUdeviceptr>(addr), bytes);
  (void)v.release(it->second.handle);
  live_.erase(it);
  if (created) free_.give(off, bytes);
}

}  // namespace moe::gpu
