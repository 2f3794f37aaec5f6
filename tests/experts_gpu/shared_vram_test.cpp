// Shared device memory, exporter and importer in one process (two reserved ranges): an import
// sees the exporter's bytes, a taken base is refused with a clear error, released places are
// reused, and a misplaced import is refused.
#include "experts/gpu/shared_vram.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/cuda/gpu_test_env.h"

namespace {

using moe::Error;
using moe::gpu::SharedVram;

TEST(SharedVram, ImportSeesTheExportersBytes) {
  MOE_REQUIRE_GPU();
  MOE_CUDA_CHECK(cudaSetDevice(0));
  MOE_CUDA_CHECK(cudaFree(nullptr));
  SharedVram a(0, 256ull << 20, 0), b(0, 256ull << 20, 0);
  ASSERT_NE(a.base(), b.base());
  // The same base again in this process is taken.
  try {
    SharedVram c(0, 64ull << 20, a.base());
    FAIL() << "a taken base was granted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("taken"), std::string::npos) << e.what();
  }

  SharedVram::Export x = a.create(3 << 20);
  EXPECT_GE(x.bytes, 3u << 20);
  EXPECT_EQ(reinterpret_cast<uint64_t>(x.ptr), a.base() + x.offset);
  std::vector<uint32_t> bytes(x.bytes / 4);
  std::mt19937 rng(3);
  for (auto& v : bytes) v = rng();
  MOE_CUDA_CHECK(cudaMemcpy(x.ptr, bytes.data(), x.bytes, cudaMemcpyHostToDevice));
  void* y = b.import(x.fd, x.offset, x.bytes);
  EXPECT_EQ(reinterpret_cast<uint64_t>(y), b.base() + x.offset);
  std::vector<uint32_t> back(bytes.size());
  MOE_CUDA_CHECK(cudaMemcpy(back.data(), y, x.bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, bytes);
  // The same place twice, and a place outside the range, are refused.
  EXPECT_THROW(b.import(x.fd, x.offset, x.bytes), Error);
  EXPECT_THROW(b.import(x.fd, b.size(), x.bytes), Error);
  ::close(x.fd);

  // Released places are reused; the import keeps the memory alive after the exporter's release.
  a.release(x.ptr);
  MOE_CUDA_CHECK(cudaMemcpy(back.data(), y, x.bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, bytes);
  b.release(y);
  SharedVram::Export z = a.create(1 << 20);
  EXPECT_EQ(z.offset, x.offset);
  ::close(z.fd);
  // A range too small for the request says so.
  EXPECT_THROW(a.create(512ull << 20), Error);
}

}  // namespace
