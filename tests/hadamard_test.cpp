// The Hadamard rotation of the KV cache against the explicit Sylvester matrix (entries ±1/sqrt(n),
// H[i][j] = (-1)^popcount(i & j) / sqrt(n)) on fresh random data, and its block sizes.
#include "kernels/cpu/hadamard.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "common/error.h"

namespace {

using moe::cpu::hadamard_block_k;
using moe::cpu::hadamard_block_v;
using moe::cpu::hadamard_blocks;

TEST(Hadamard, MatchesTheSylvesterMatrixBlockByBlock) {
  std::mt19937 rng(12345);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (int64_t block : {1, 2, 8, 64, 128, 256}) {
    const int64_t n = block * 3;
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = dist(rng);
    std::vector<float> y = x;
    hadamard_blocks(y.data(), n, block);
    double max_err = 0;
    for (int64_t b = 0; b < n; b += block) {
      for (int64_t i = 0; i < block; ++i) {
        double want = 0;
        for (int64_t j = 0; j < block; ++j) {
          const int sign = std::popcount(static_cast<uint64_t>(i & j)) % 2 ? -1 : 1;
          want += sign * static_cast<double>(x[static_cast<size_t>(b + j)]);
        }
        want /= std::sqrt(static_cast<double>(block));
        max_err = std::max(max_err, std::fabs(want - y[static_cast<size_t>(b + i)]));
      }
    }
    EXPECT_LT(max_err, 1e-4 * std::sqrt(static_cast<double>(block))) << "block " << block;
    // Its own inverse: applying it twice gives x back.
    hadamard_blocks(y.data(), n, block);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(y[static_cast<size_t>(i)], x[static_cast<size_t>(i)], 1e-4f) << i;
    }
  }
}

TEST(Hadamard, BlockSizesFollowLlamaCpp) {
  EXPECT_EQ(hadamard_block_k(64), 64);
  EXPECT_EQ(hadamard_block_k(128), 128);
  EXPECT_EQ(hadamard_block_k(256), 256);
  EXPECT_EQ(hadamard_block_k(192), 64);  // the largest power of two >= 64 dividing it
  EXPECT_EQ(hadamard_block_k(96), 0);    // not a multiple of 64: not rotated
  EXPECT_EQ(hadamard_block_k(32), 0);
  EXPECT_EQ(hadamard_block_v(256), 64);
  EXPECT_EQ(hadamard_block_v(128), 64);
  EXPECT_EQ(hadamard_block_v(96), 0);
}

TEST(Hadamard, RefusesABlockThatIsNotAPowerOfTwoDividingTheRow) {
  std::vector<float> x(96);
  EXPECT_THROW(hadamard_blocks(x.data(), 96, 48), moe::Error);
  EXPECT_THROW(hadamard_blocks(x.data(), 96, 64), moe::Error);
  EXPECT_THROW(hadamard_blocks(x.data(), 96, 0), moe::Error);
}

}  // namespace
