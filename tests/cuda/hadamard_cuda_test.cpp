// The GPU's Hadamard rotation of KV rows against the CPU reference (kernels/cpu/hadamard.cpp), bit
// for bit, on fresh random data: every block size the caches use, strided rows (q, k and v side by
// side in one projection row), and values outside the rotated columns left alone.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/hadamard.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cuda/hadamard.h"
#include "tests/cuda/gpu_test_env.h"

namespace moe::cuda {
namespace {

TEST(HadamardCuda, MatchesTheCpuBitForBit) {
  MOE_REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  struct Case {
    int64_t rows, stride, n, block;
  };
  for (const Case c : {Case{1, 64, 64, 64}, Case{5, 512, 512, 128}, Case{3, 1100, 1024, 256},
                       Case{7, 256, 256, 64}, Case{2, 2048, 1024, 1024}, Case{4, 40, 32, 2}}) {
    SCOPED_TRACE(std::to_string(c.block) + " in rows of " + std::to_string(c.n));
    std::vector<float> x = test::random_floats(c.rows * c.stride, rng);
    const auto dx = test::to_device(x);
    hadamard_rows(dx.as<float>(), c.rows, c.stride, c.n, c.block, nullptr);
    MOE_CUDA_CHECK(cudaDeviceSynchronize());
    for (int64_t r = 0; r < c.rows; ++r)
      cpu::hadamard_blocks(x.data() + r * c.stride, c.n, c.block);
    EXPECT_EQ(test::to_host<float>(dx, x.size()), x);  // the columns past n untouched on both
  }
}

TEST(HadamardCuda, RefusesBadShapes) {
  float* x = reinterpret_cast<float*>(sizeof(float));  // never dereferenced: checks come first
  test::expect_error([&] { hadamard_rows(x, 1, 64, 64, 48, nullptr); }, "invalid shape");
  test::expect_error([&] { hadamard_rows(x, 1, 64, 96, 64, nullptr); }, "invalid shape");
  test::expect_error([&] { hadamard_rows(x, 1, 64, 128, 64, nullptr); }, "invalid shape");
  test::expect_error([&] { hadamard_rows(x, 1, 4096, 4096, 2048, nullptr); }, "invalid shape");
  test::expect_error([&] { hadamard_rows(nullptr, 1, 64, 64, 64, nullptr); }, "invalid shape");
}

}  // namespace
}  // namespace moe::cuda
