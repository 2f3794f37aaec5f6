// Device memory that two processes map at the same virtual address (CUDA virtual memory
// management): the coordinator creates each allocation and exports it as a file descriptor, its
// GPU worker imports it at the same offset of a range both reserved at the same base. A device
// pointer, and a table of device pointers in device memory, then mean the same thing in both
// processes, so the worker can run the coordinator's kernel launches unchanged.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "experts/gpu/range_list.h"

namespace moe::gpu {

class SharedVram {
 public:
  // Reserves `bytes` of device address space for `device` (the current device), at `at` when it
  // is not 0. Throws moe::Error when the driver lacks virtual memory management or shareable
  // handles, or when `at` was asked for and the driver placed the range elsewhere.
  SharedVram(int device, uint64_t bytes, uint64_t at);
  // Unmaps and releases whatever is still mapped, and frees the range.
  ~SharedVram();
  SharedVram(const SharedVram&) = delete;
  SharedVram& operator=(const SharedVram&) = delete;

  uint64_t base() const { return base_; }
  uint64_t size() const { return size_; }

  struct Export {
    void* ptr = nullptr;
    uint64_t offset = 0;  // from base()
    uint64_t bytes = 0;   // rounded up to the allocation granularity
    int fd = -1;          // the allocation's shareable handle; the caller closes it
  };
  // A new allocation of at least `bytes`, mapped read/write for this device in a free part of
  // the range. Throws moe::Error (device out of memory, range full, driver refusal).
  Export create(size_t bytes);
  // Maps the allocation behind `fd` (from another process's create()) at base() + offset; the fd
  // stays the caller's. Throws when the place is outside the range or already used.
  void* import(int fd, uint64_t offset, uint64_t bytes);
  // Unmaps the allocation at `p` (from create() or import()) and releases this process's handle:
  // the memory is freed once no process maps it. Unknown pointers are ignored.
  void release(void* p) noexcept;

 private:
  struct Mapping {
    uint64_t bytes;
    CUmemGenericAllocationHandle handle;
    bool created;  // by create(): its place returns to free_
  };
  void map_at(uint64_t offset, uint64_t bytes, CUmemGenericAllocationHandle h, bool created);
  int device_;
  uint64_t base_ = 0, size_ = 0, granularity_ = 0;
  std::mutex mu_;
  std::map<uint64_t, Mapping> live_;  // by offset
  RangeList free_{0};                 // where create() may map
};

}  // namespace moe::gpu
