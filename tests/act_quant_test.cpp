// Activation quantization (llama.cpp's vec_dot_type conversions): format mapping, sizes, and the
// properties of the reference quantizers on random rows, an outlier row and an all-zero block.
#include "kernels/cpu/act_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "common/ggml_type.h"

namespace {

using moe::GgmlType;
using moe::cpu::ActFormat;
using moe::cpu::BlockQ8_0;
using moe::cpu::BlockQ8_1;
using moe::cpu::BlockQ8_K;

constexpr int64_t kN = 4096;

// Normal(0,1) values; block 3 (elements 768..1023, a whole Q8_K block) is zero; block 5 of 32
// holds one value with a large negative outlier, block 7 a positive one.
std::vector<float> test_row(uint32_t seed, bool outliers) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(kN);
  for (auto& v : x) v = dist(rng);
  std::fill(x.begin() + 768, x.begin() + 1024, 0.0f);
  if (outliers) {
    x[5 * 32 + 17] = -250.0f;
    x[7 * 32 + 3] = 1.0e4f;
    x[2048 + 100] = 3.0e3f;  // dominates a whole Q8_K block
  }
  return x;
}

template <typename Block>
std::vector<Block> quantize(ActFormat f, const std::vector<float>& x) {
  const size_t bytes = moe::cpu::act_row_bytes(f, static_cast<int64_t>(x.size()));
  EXPECT_EQ(bytes % sizeof(Block), 0u);
  std::vector<Block> out(bytes / sizeof(Block));
  moe::cpu::quantize_act_row_ref(f, x.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

std::vector<float> dequantize(ActFormat f, const void* src, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  moe::cpu::dequantize_act_row(f, src, y.data(), n);
  return y;
}

TEST(ActQuant, FormatForWeightType) {
  EXPECT_EQ(moe::cpu::act_format_for(GgmlType::F32), ActFormat::F32);
  EXPECT_EQ(moe::cpu::act_format_for(GgmlType::F16), ActFormat::F16);
  EXPECT_EQ(moe::cpu::act_format_for(GgmlType::BF16), ActFormat::BF16);
  for (const auto t :
       {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::IQ4_NL, GgmlType::Q2_0}) {
    EXPECT_EQ(moe::cpu::act_format_for(t), ActFormat::Q8_0);
  }
  EXPECT_EQ(moe::cpu::act_format_for(GgmlType::MXFP4), ActFormat::Q8_0U4);
  EXPECT_EQ(moe::cpu::act_format_for(GgmlType::Q4_1), ActFormat::Q8_1);
  EXPECT_EQ(moe::cpu::act_format_for(GgmlType::Q5_1), ActFormat::Q8_1);
  for (const auto t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                       GgmlType::Q6_K, GgmlType::IQ4_XS}) {
    EXPECT_EQ(moe::cpu::act_format_for(t), ActFormat::Q8_K);
  }
  // Every computable type has an activation format; everything else throws naming the type.
  for (uint32_t id = 0; id < 64; ++id) {
    const auto info = moe::ggml_type_info(id);
    if (info && info->computable) {
      EXPECT_NO_THROW(moe::cpu::act_format_for(static_cast<GgmlType>(id))) << id;
    }
  }
  for (const auto t : {GgmlType::Q8_K, GgmlType::Q8_1, GgmlType::IQ2_XXS, GgmlType::NVFP4,
                       GgmlType::I8, static_cast<GgmlType>(77)}) {
    try {
      moe::cpu::act_format_for(t);
      ADD_FAILURE() << "no error for " << moe::ggml_type_label(static_cast<uint32_t>(t));
    } catch (const moe::Error& e) {
      EXPECT_NE(std::string(e.what()).find(moe::ggml_type_label(static_cast<uint32_t>(t))),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(ActQuant, BlockSizesAndRowBytes) {
  EXPECT_EQ(moe::cpu::act_block_size(ActFormat::F32), 1);
  EXPECT_EQ(moe::cpu::act_block_size(ActFormat::F16), 1);
  EXPECT_EQ(moe::cpu::act_block_size(ActFormat::BF16), 1);
  EXPECT_EQ(moe::cpu::act_block_size(ActFormat::Q8_0), 32);
  EXPECT_EQ(moe::cpu::act_block_size(ActFormat::Q8_1), 32);
  EXPECT_EQ(moe::cpu::act_block_size(ActFormat::Q8_K), 256);
  EXPECT_EQ(moe::cpu::act_row_bytes(ActFormat::F32, 768), 768u * 4);
  EXPECT_EQ(moe::cpu::act_row_bytes(ActFormat::F16, 7), 14u);
  EXPECT_EQ(moe::cpu::act_row_bytes(ActFormat::BF16, 768), 768u * 2);
  EXPECT_EQ(moe::cpu::act_row_bytes(ActFormat::Q8_0, 768), 24u * 34);
  EXPECT_EQ(moe::cpu::act_row_bytes(ActFormat::Q8_1, 768), 24u * 36);
  EXPECT_EQ(moe::cpu::act_row_bytes(ActFormat::Q8_K, 768), 3u * 292);
  EXPECT_EQ(moe::cpu::act_row_bytes(ActFormat::Q8_K, 0), 0u);
  EXPECT_EQ(moe::cpu::act_block_size(ActFormat::Q8_0U4), 32);
  EXPECT_EQ(moe::cpu::act_row_bytes(ActFormat::Q8_0U4, 768), 6u * 160);
  EXPECT_EQ(moe::cpu::act_row_bytes(ActFormat::Q8_0U4, 2880), 23u * 160);  // last group padded
  EXPECT_THROW(moe::cpu::act_row_bytes(ActFormat::Q8_0, 48), moe::Error);
  EXPECT_THROW(moe::cpu::act_row_bytes(ActFormat::Q8_K, 512 + 32), moe::Error);
  EXPECT_THROW(moe::cpu::act_row_bytes(ActFormat::Q8_1, -32), moe::Error);
  std::vector<float> x(300, 1.0f);
  std::vector<uint8_t> buf(4096);
  EXPECT_THROW(moe::cpu::quantize_act_row_ref(ActFormat::Q8_K, x.data(), buf.data(), 300),
               moe::Error);
  EXPECT_THROW(moe::cpu::quantize_act_row_ref(ActFormat::Q8_0, x.data(), buf.data(), 40),
               moe::Error);
  EXPECT_THROW(moe::cpu::dequantize_act_row(ActFormat::Q8_1, buf.data(), x.data(), 33), moe::Error);
}

// Checks one 32-block of Q8_0/Q8_1: d, the max element at +-127, the per-element error.
void check_block32(const float* x, uint16_t d16, const int8_t* qs, const float* y) {
  float amax = 0.0f;
  int imax = 0;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      imax = j;
    }
  }
  const float d = amax / 127.0f;
  EXPECT_EQ(d16, moe::fp32_to_fp16(d));
  const float dq = moe::fp16_to_fp32(d16);
  if (amax == 0.0f) {
    for (int j = 0; j < 32; ++j) EXPECT_EQ(qs[j], 0);
    return;
  }
  EXPECT_EQ(qs[imax], x[imax] > 0 ? 127 : -127);
  for (int j = 0; j < 32; ++j) {
    EXPECT_GE(qs[j], -127);
    // Rounding to the grid of the unrounded d: at most d/2.
    EXPECT_LE(std::fabs(x[j] - static_cast<float>(qs[j]) * d), 0.5f * d * (1 + 1e-5f)) << j;
    // The decoded value uses fp16(d): add |q| * |d - fp16(d)|.
    const float bound = 0.5f * d * (1 + 1e-5f) +
                        std::fabs(static_cast<float>(qs[j])) * std::fabs(d - dq) * (1 + 1e-5f);
    EXPECT_LE(std::fabs(x[j] - y[j]), bound) << j;
    EXPECT_EQ(y[j], static_cast<float>(qs[j]) * dq);
  }
}

class ActQuantRows : public testing::TestWithParam<bool> {};  // param: with outliers

TEST_P(ActQuantRows, Q8_0) {
  const auto x = test_row(GetParam() ? 1001u : 1002u, GetParam());
  const auto q = quantize<BlockQ8_0>(ActFormat::Q8_0, x);
  ASSERT_EQ(q.size(), static_cast<size_t>(kN / 32));
  const auto y = dequantize(ActFormat::Q8_0, q.data(), kN);
  for (size_t b = 0; b < q.size(); ++b) {
    SCOPED_TRACE("block " + std::to_string(b));
    check_block32(x.data() + 32 * b, q[b].d, q[b].qs, y.data() + 32 * b);
  }
  EXPECT_EQ(q[24].d, 0);  // inside the zero region
}

TEST_P(ActQuantRows, Q8_1) {
  const auto x = test_row(GetParam() ? 2001u : 2002u, GetParam());
  const auto q = quantize<BlockQ8_1>(ActFormat::Q8_1, x);
  ASSERT_EQ(q.size(), static_cast<size_t>(kN / 32));
  const auto y = dequantize(ActFormat::Q8_1, q.data(), kN);
  for (size_t b = 0; b < q.size(); ++b) {
    SCOPED_TRACE("block " + std::to_string(b));
    const float* xb = x.data() + 32 * b;
    check_block32(xb, q[b].d, q[b].qs, y.data() + 32 * b);
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += q[b].qs[j];
    EXPECT_EQ(q[b].s, moe::fp32_to_fp16(d * static_cast<float>(sum)));
  }
  // Same qs and d as Q8_0.
  const auto q0 = quantize<BlockQ8_0>(ActFormat::Q8_0, x);
  for (size_t b = 0; b < q.size(); ++b) {
    EXPECT_EQ(q[b].d, q0[b].d);
    EXPECT_EQ(std::memcmp(q[b].qs, q0[b].qs, 32), 0);
  }
}

// Q8_0U4 holds Q8_0's values (same d and qs) in its own layout: every element decodes to the
// same float, on whole and padded last groups; the layout is a permutation of a group's bytes.
TEST_P(ActQuantRows, Q8_0U4) {
  const auto x = test_row(GetParam() ? 5001u : 5002u, GetParam());
  for (int64_t n : {kN, kN - 32, kN - 96, int64_t{32}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const std::vector<float> xn(x.begin(), x.begin() + n);
    const auto q0 = quantize<BlockQ8_0>(ActFormat::Q8_0, xn);
    std::vector<uint8_t> u(moe::cpu::act_row_bytes(ActFormat::Q8_0U4, n));
    moe::cpu::quantize_act_row(ActFormat::Q8_0U4, xn.data(), u.data(), n, moe::cpu::Isa::Avx2);
    const auto want = dequantize(ActFormat::Q8_0, q0.data(), n);
    const auto got = dequantize(ActFormat::Q8_0U4, u.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << i;
    // The padding of the last group is zero (qs 128, d 0).
    const int64_t nb = n / 32;
    const uint8_t* last = u.data() + (nb - 1) / 4 * moe::cpu::kQ8_0U4GroupBytes;
    for (int j = static_cast<int>(nb % 4); nb % 4 != 0 && j < 4; ++j) {
      for (int e = 0; e < 32; ++e) EXPECT_EQ(last[moe::cpu::act_q8_0u4_offset(j, e)], 128);
    }
  }
  std::vector<int> seen(moe::cpu::kQ8_0U4GroupQs, 0);
  for (int j = 0; j < 4; ++j) {
    for (int e = 0; e < 32; ++e) ++seen[static_cast<size_t>(moe::cpu::act_q8_0u4_offset(j, e))];
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), moe::cpu::kQ8_0U4GroupQs);
}

TEST_P(ActQuantRows, Q8_K) {
  const auto x = test_row(GetParam() ? 3001u : 3002u, GetParam());
  const auto q = quantize<BlockQ8_K>(ActFormat::Q8_K, x);
  ASSERT_EQ(q.size(), static_cast<size_t>(kN / 256));
  const auto y = dequantize(ActFormat::Q8_K, q.data(), kN);
  for (size_t b = 0; b < q.size(); ++b) {
    SCOPED_TRACE("block " + std::to_string(b));
    const float* xb = x.data() + 256 * b;
    const float* yb = y.data() + 256 * b;
    float amax = 0.0f;
    float max = 0.0f;
    int imax = 0;
    for (int j = 0; j < 256; ++j) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
        imax = j;
      }
    }
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int k = 0; k < 16; ++k) sum += q[b].qs[16 * g + k];
      EXPECT_EQ(q[b].bsums[g], sum) << "group " << g;
    }
    if (amax == 0.0f) {
      EXPECT_EQ(q[b].d, 0.0f);
      for (int j = 0; j < 256; ++j) EXPECT_EQ(q[b].qs[j], 0);
      continue;
    }
    // iscale = -127/max: the max-magnitude element always becomes -127 and d has the opposite
    // sign of that element.
    const float iscale = -127.0f / max;
    EXPECT_EQ(std::bit_cast<uint32_t>(q[b].d), std::bit_cast<uint32_t>(1.0f / iscale));
    EXPECT_EQ(q[b].qs[imax], -127);
    EXPECT_EQ(std::signbit(q[b].d), !std::signbit(max));
    const float ad = std::fabs(q[b].d);
    for (int j = 0; j < 256; ++j) {
      EXPECT_GE(q[b].qs[j], -127);
      EXPECT_LE(q[b].qs[j], 127);
      EXPECT_LE(std::fabs(xb[j] - yb[j]), 0.5f * ad * (1 + 1e-5f) + 1e-6f * std::fabs(xb[j])) << j;
      EXPECT_EQ(yb[j], q[b].d * static_cast<float>(q[b].qs[j]));
    }
  }
  EXPECT_EQ(q[3].d, 0.0f);  // the all-zero block
}

TEST_P(ActQuantRows, F16AndBF16AndF32) {
  const auto x = test_row(GetParam() ? 4001u : 4002u, GetParam());
  std::vector<uint16_t> h(kN);
  moe::cpu::quantize_act_row_ref(ActFormat::F16, x.data(), h.data(), kN);
  std::vector<uint16_t> bh(kN);
  moe::cpu::quantize_act_row_ref(ActFormat::BF16, x.data(), bh.data(), kN);
  std::vector<float> f(kN);
  moe::cpu::quantize_act_row_ref(ActFormat::F32, x.data(), f.data(), kN);
  const auto yh = dequantize(ActFormat::F16, h.data(), kN);
  const auto yb = dequantize(ActFormat::BF16, bh.data(), kN);
  const auto yf = dequantize(ActFormat::F32, f.data(), kN);
  for (int64_t i = 0; i < kN; ++i) {
    EXPECT_EQ(h[i], moe::fp32_to_fp16(x[i]));
    EXPECT_EQ(bh[i], moe::fp32_to_bf16(x[i]));
    EXPECT_EQ(std::bit_cast<uint32_t>(yf[i]), std::bit_cast<uint32_t>(x[i]));
    EXPECT_EQ(yh[i], moe::fp16_to_fp32(h[i]));
    EXPECT_EQ(yb[i], moe::bf16_to_fp32(bh[i]));
    // Round to nearest: relative error at most 2^-11 (fp16, normal range) / 2^-8 (bf16).
    EXPECT_LE(std::fabs(yh[i] - x[i]), std::ldexp(std::fabs(x[i]), -11) + std::ldexp(1.0f, -25));
    EXPECT_LE(std::fabs(yb[i] - x[i]), std::ldexp(std::fabs(x[i]), -8));
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, ActQuantRows, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("WithOutliers") : std::string("Normal");
                         });

TEST(ActQuant, RoundingModes) {
  // Q8_0/Q8_1 round half away from zero (roundf); Q8_K rounds half to even (nearest_int).
  std::vector<float> x(256, 0.0f);
  x[0] = 127.0f;  // Q8_0 block 0: d = 1, id = 1
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 3.5f;
  x[4] = 0.5f;
  const auto q0 = quantize<BlockQ8_0>(ActFormat::Q8_0, x);
  EXPECT_EQ(moe::fp16_to_fp32(q0[0].d), 1.0f);
  EXPECT_EQ(q0[0].qs[0], 127);
  EXPECT_EQ(q0[0].qs[1], 3);
  EXPECT_EQ(q0[0].qs[2], -3);
  EXPECT_EQ(q0[0].qs[3], 4);
  EXPECT_EQ(q0[0].qs[4], 1);

  x[0] = -127.0f;  // Q8_K: max = -127, iscale = 1
  const auto qk = quantize<BlockQ8_K>(ActFormat::Q8_K, x);
  EXPECT_EQ(qk[0].d, 1.0f);
  EXPECT_EQ(qk[0].qs[0], -127);
  EXPECT_EQ(qk[0].qs[1], 2);
  EXPECT_EQ(qk[0].qs[2], -2);
  EXPECT_EQ(qk[0].qs[3], 4);
  EXPECT_EQ(qk[0].qs[4], 0);
  EXPECT_EQ(qk[0].bsums[0], -127 + 2 - 2 + 4);

  x[0] = 127.0f;  // max = +127: iscale = -1, so every value flips sign and d = -1
  const auto qk2 = quantize<BlockQ8_K>(ActFormat::Q8_K, x);
  EXPECT_EQ(qk2[0].d, -1.0f);
  EXPECT_EQ(qk2[0].qs[0], -127);
  EXPECT_EQ(qk2[0].qs[1], -2);
  EXPECT_EQ(qk2[0].qs[2], 2);
  EXPECT_EQ(qk2[0].qs[3], -4);
}

TEST(ActQuant, Q8_1SumField) {
  // Block with qs summing to a known value: x = j for j < 32, amax = 31, d = 31/127.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j) - 10.0f;
  const auto q = quantize<BlockQ8_1>(ActFormat::Q8_1, x);
  const float d = 21.0f / 127.0f;
  int sum = 0;
  for (int j = 0; j < 32; ++j) sum += q[0].qs[j];
  EXPECT_EQ(q[0].qs[31], 127);
  EXPECT_EQ(q[0].qs[10], 0);
  EXPECT_EQ(q[0].s, moe::fp32_to_fp16(static_cast<float>(sum) * d));
  EXPECT_EQ(q[0].d, moe::fp32_to_fp16(d));
}

// The AVX2 Q8_K conversion gives the reference's bytes: fresh random rows at several scales, and
// the edge cases where a vector path could differ (a zero block, +a and -a both of the largest
// magnitude, exact .5 products, a denormal maximum whose scale overflows, infinities and NaNs).
TEST(ActQuant, Q8KFastPathEqualsReference) {
  if (!moe::cpu::isa_supported(moe::cpu::Isa::Avx2)) {
    GTEST_FAIL() << "this test needs an AVX2 machine (every machine we build on has one)";
  }
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> rows;
  for (const float scale : {1.0f, 1e-3f, 37.0f, 1e-30f}) {
    std::vector<float> r(1024);
    for (float& v : r) v = nd(rng) * scale;
    rows.push_back(r);
  }
  // Elements whose product with the block's scale lies so close to a half-integer that fusing
  // the rounding add into the multiply (one rounding instead of two: what a compiler may do to
  // x * iscale + 1.5 * 2^23 where FMA is enabled) changes the result. Random data meets one in
  // about 300,000, so they are searched for.
  {
    const float mx = 3.7f;
    const float iscale = -127.0f / mx;
    std::uniform_real_distribution<float> u(-mx, mx);
    std::vector<float> r(256, 0.0f);
    r[0] = mx;
    int found = 1;
    for (int64_t tries = 0; found < 33 && tries < 100'000'000; ++tries) {
      const float v = u(rng);
      volatile float product = iscale * v;  // rounded on its own, as the reference does
      if (product + 12582912.f != std::fma(iscale, v, 12582912.f))
        r[static_cast<size_t>(found++)] = v;
    }
    ASSERT_GE(found, 16) << "too few rounding-sensitive elements found";
    rows.push_back(r);
  }
  std::vector<float> edge(256 * 7, 0.0f);  // block 0 stays zero
  for (int j = 0; j < 256; ++j) edge[256 + j] = nd(rng);
  edge[256 + 40] = 9.0f;  // block 1: +9 before -9: the first one sets the sign
  edge[256 + 200] = -9.0f;
  for (int j = 0; j < 256; ++j) edge[512 + j] = static_cast<float>(j % 255 - 127) / 2.0f;  // ties
  for (int j = 0; j < 256; ++j) edge[768 + j] = 1e-42f * static_cast<float>(j % 7 - 3);  // denormal
  for (int j = 0; j < 256; ++j) edge[1024 + j] = nd(rng);
  edge[1024 + 17] = INFINITY;
  for (int j = 0; j < 256; ++j) edge[1280 + j] = nd(rng);
  edge[1280 + 3] = NAN;
  edge[1280 + 100] = -NAN;
  for (int j = 0; j < 256; ++j) edge[1536 + j] = -NAN;  // block 6: nothing but NaN
  rows.push_back(edge);
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    const auto n = static_cast<int64_t>(rows[i].size());
    const size_t bytes = moe::cpu::act_row_bytes(ActFormat::Q8_K, n);
    std::vector<uint8_t> want(bytes, 0xAB), got(bytes, 0xCD);
    moe::cpu::quantize_act_row_ref(ActFormat::Q8_K, rows[i].data(), want.data(), n);
    moe::cpu::quantize_act_row(ActFormat::Q8_K, rows[i].data(), got.data(), n, moe::cpu::Isa::Avx2);
    for (size_t b = 0; b < bytes; ++b) ASSERT_EQ(got[b], want[b]) << "byte " << b;
  }
  std::vector<uint8_t> out(moe::cpu::act_row_bytes(ActFormat::Q8_K, 256));
  EXPECT_THROW(moe::cpu::quantize_act_row(ActFormat::Q8_K, rows[0].data(), out.data(), 100,
                                          moe::cpu::Isa::Avx2),
               moe::Error);
}

}  // namespace
