// Two 32-bit counters in a page of host memory that the coordinator and its GPU worker share
// (a memfd both map and register with the driver): "go" (the coordinator's stream has produced a
// batch's inputs) and "done" (the worker's stream has finished it). Each process's streams wait
// on and write them with stream memory operations, so a layer's hand-off between the two CUDA
// contexts involves no host; the host only writes "done" itself to free a coordinator stream
// whose worker died.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moe::gpu {

class SharedFlags {
 public:
  enum Which { Go = 0, Done = 1 };

  // A new page (the coordinator); fd() passes it to the worker.
  SharedFlags();
  // The page behind `fd` (the worker; the fd stays the caller's).
  explicit SharedFlags(int fd);
  ~SharedFlags();
  SharedFlags(const SharedFlags&) = delete;
  SharedFlags& operator=(const SharedFlags&) = delete;

  int fd() const { return fd_; }
  // Enqueues on `stream`: continue once counter `w` has reached `value` (cyclic comparison).
  void wait(cudaStream_t stream, Which w, uint32_t value) const;
  // Enqueues on `stream`: store `value` once the work before it is done.
  void write(cudaStream_t stream, Which w, uint32_t value) const;
  // Host side, with release / acquire ordering.
  void set(Which w, uint32_t value);
  uint32_t get(Which w) const;

 private:
  void map_and_register();
  using MemOpFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  int fd_ = -1;
  bool own_fd_ = false;
  uint32_t* host_ = nullptr;  // counters 64 bytes apart (one cache line each)
  CUdeviceptr dev_ = 0;
  MemOpFn wait_ = nullptr, write_ = nullptr;
};

}  // namespace moe::gpu
