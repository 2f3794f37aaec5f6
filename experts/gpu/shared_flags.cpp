#include "experts/gpu/shared_flags.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/driver_api.h"

namespace moe::gpu {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kStride = 16;  // uint32 words between the counters: 64 bytes

}  // namespace

SharedFlags::SharedFlags() {
  fd_ = ::memfd_create("moe-gpu-worker-flags", MFD_CLOEXEC);
  if (fd_ < 0) throw Error(std::string("memfd_create failed: ") + std::strerror(errno));
  own_fd_ = true;
  if (::ftruncate(fd_, kPage) != 0) {
    const int e = errno;
    ::close(fd_);
    throw Error(std::string("ftruncate of the flag page failed: ") + std::strerror(e));
  }
  map_and_register();
}

SharedFlags::SharedFlags(int fd) : fd_(fd) { map_and_register(); }

void SharedFlags::map_and_register() {
  void* p = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    if (own_fd_) ::close(fd_);
    throw Error(std::string("mapping the flag page failed: ") + std::strerror(e));
  }
  host_ = static_cast<uint32_t*>(p);
  try {
    MOE_CUDA_CHECK(cudaHostRegister(p, kPage, cudaHostRegisterMapped | cudaHostRegisterPortable));
    void* d = nullptr;
    MOE_CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
    dev_ = reinterpret_cast<CUdeviceptr>(d);
    wait_ = cuda::require_driver_function<MemOpFn>("cuStreamWaitValue32");
    write_ = cuda::require_driver_function<MemOpFn>("cuStreamWriteValue32");
  } catch (...) {
    (void)cudaHostUnregister(p);
    ::munmap(p, kPage);
    if (own_fd_) ::close(fd_);
    throw;
  }
}

SharedFlags::~SharedFlags() {
  (void)cudaHostUnregister(host_);
  ::munmap(host_, kPage);
  if (own_fd_) ::close(fd_);
}

void SharedFlags::wait(cudaStream_t stream, Which w, uint32_t value) const {
  cuda::check_driver(wait_(stream, dev_ + w * kStride * 4, value, CU_STREAM_WAIT_VALUE_GEQ),
                     "cuStreamWaitValue32");
}

void SharedFlags::write(cudaStream_t stream, Which w, uint32_t value) const {
  cuda::check_driver(write_(stream, dev_ + w * kStride * 4, value, CU_STREAM_WRITE_VALUE_DEFAULT),
                     "cuStreamWriteValue32");
}

void SharedFlags::set(Which w, uint32_t value) {
  std::atomic_ref<uint32_t>(host_[w * kStride]).store(value, std::memory_order_release);
}

uint32_t SharedFlags::get(Which w) const {
  return std::atomic_ref<uint32_t>(host_[w * kStride]).load(std::memory_order_acquire);
}

}  // namespace moe::gpu
