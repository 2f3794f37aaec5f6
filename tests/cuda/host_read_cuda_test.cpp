// Reads of pinned host memory through the SMs (kernels/cuda/host_read.h, and add_inplace given a
// pinned source) against the host's bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/host_read.h"
#include "tests/cuda/gpu_test_env.h"

namespace moe::cuda {
namespace {

// Page-locked host memory, freed at scope exit.
struct Pinned {
  explicit Pinned(size_t bytes) { MOE_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault)); }
  ~Pinned() { (void)cudaFreeHost(p); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  void* p = nullptr;
};

std::mt19937 seeded_rng() {
  const unsigned seed = std::random_device{}();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return std::mt19937(seed);
}

TEST(HostReadCuda, CopiesEveryByteAndNothingPast) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  std::uniform_int_distribution<int> byte(0, 255);
  // Sizes around the 16-byte unit, one block's and many blocks' worth.
  for (const size_t bytes : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{4096 + 7},
                             size_t{70001}, size_t{5u << 20}}) {
    Pinned src(bytes);
    auto* s = static_cast<unsigned char*>(src.p);
    for (size_t i = 0; i < bytes; ++i) s[i] = static_cast<unsigned char>(byte(rng));
    // A guard after the copied range must keep its bytes.
    const size_t guard = 64;
    std::vector<unsigned char> init(bytes + guard);
    for (auto& v : init) v = static_cast<unsigned char>(byte(rng));
    const auto dst = test::to_device(init);
    copy_from_host(dst.get(), src.p, bytes, nullptr);
    MOE_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = test::to_host<unsigned char>(dst, bytes + guard);
    EXPECT_EQ(std::memcmp(got.data(), s, bytes), 0) << bytes << " bytes";
    EXPECT_EQ(std::memcmp(got.data() + bytes, init.data() + bytes, guard), 0)
        << "bytes past " << bytes << " changed";
  }
}

TEST(HostReadCuda, AddInplaceReadsAPinnedSource) {
  MOE_REQUIRE_GPU();
  auto rng = seeded_rng();
  const int64_t n = 300007;
  const auto x = test::random_floats(n, rng);
  const auto y = test::random_floats(n, rng);
  Pinned hy(static_cast<size_t>(n) * sizeof(float));
  std::memcpy(hy.p, y.data(), y.size() * sizeof(float));
  const auto dx = test::to_device(x);
  add_inplace(dx.as<float>(), static_cast<const float*>(hy.p), n, nullptr);
  MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = test::to_host<float>(dx, static_cast<size_t>(n));
  int reported = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = x[static_cast<size_t>(i)] + y[static_cast<size_t>(i)];
    if (got[static_cast<size_t>(i)] != want && reported++ < 5) {
      ADD_FAILURE() << "[" << i << "]: got " << got[static_cast<size_t>(i)] << " want " << want;
    }
  }
}

TEST(HostReadCuda, RejectsBadArguments) {
  alignas(16) unsigned char buf[48] = {};
  EXPECT_THROW(copy_from_host(nullptr, buf, 16, nullptr), Error);
  EXPECT_THROW(copy_from_host(buf + 1, buf, 16, nullptr), Error);
  EXPECT_THROW(copy_from_host(buf, buf + 4, 16, nullptr), Error);
  EXPECT_NO_THROW(copy_from_host(nullptr, nullptr, 0, nullptr));  // nothing to do
}

}  // namespace
}  // namespace moe::cuda
