// cpu::decode_kv_rows (how the CPU attention reads the KV cache) gives dequantize_row's bits on
// every ISA this machine has: F16 through F16C for every one of the 65,536 half values (NaNs stay
// NaN), rows at a stride wider than their values and a tail shorter than a vector; the other
// cache types through the reference decoder. The iq4_nl encoder (kv_quant.cpp's own rule) against
// a scalar double-precision reference of the block layout and of the rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/ggml_type.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/kv_quant.h"

namespace moe::cpu {
namespace {

TEST(DecodeKvRows, F16EveryValueOnEveryIsa) {
  // 65,536 halves as 512 rows of 128 values, rows 272 bytes apart (16 bytes of padding).
  constexpr int64_t kElems = 128, kRows = 512;
  constexpr size_t kRowBytes = kElems * 2 + 16;
  std::vector<uint8_t> src(kRows * kRowBytes, 0xAB);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t i = 0; i < kElems; ++i) {
      const auto h = static_cast<uint16_t>(r * kElems + i);
      std::memcpy(src.data() + r * kRowBytes + 2 * i, &h, 2);
    }
  }
  std::vector<float> want(kRows * kElems);
  for (int64_t r = 0; r < kRows; ++r) {
    dequantize_row(GgmlType::F16, src.data() + r * kRowBytes, want.data() + r * kElems, kElems);
  }
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (!isa_supported(isa)) continue;
    std::vector<float> got(want.size(), -1.0f);
    decode_kv_rows(GgmlType::F16, src.data(), kRowBytes, kRows, kElems, got.data(), isa);
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) {
        ASSERT_TRUE(std::isnan(got[i])) << "half " << i << " " << isa_name(isa);
      } else {
        ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << "half " << i << " " << isa_name(isa);
      }
    }
  }
}

TEST(DecodeKvRows, ShortRowsAndOtherTypesMatchTheReference) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (GgmlType t :
       {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::IQ4_NL}) {
    const int64_t elems = t == GgmlType::F16 || t == GgmlType::BF16 ? 13 : 64;  // F16: a tail
    const size_t row_bytes = static_cast<size_t>(*ggml_row_bytes(t, elems)) + 6;
    const int64_t rows = 5;
    std::vector<uint8_t> src(rows * row_bytes);
    std::vector<float> x(static_cast<size_t>(elems));
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : x) v = u(rng);
      encode_kv_row(t, x.data(), src.data() + r * row_bytes, elems);
    }
    std::vector<float> want(static_cast<size_t>(rows * elems)), got(want.size());
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(t, src.data() + r * row_bytes, want.data() + r * elems, elems);
    }
    decode_kv_rows(t, src.data(), row_bytes, rows, elems, got.data(), best_isa());
    EXPECT_EQ(got, want) << ggml_type_label(static_cast<uint32_t>(t));
  }
}

// ---- iq4_nl ---------------------------------------------------------------------------------

// The test's own copy of ggml's kvalues_iq4nl and of the block layout: f16 d, then 16 bytes whose
// low nibbles are elements 0..15 and high nibbles 16..31.
constexpr int kTable[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                            1,    13,   25,  38,  53,  69,  89,  113};

// IEEE half to double, by hand.
double half_to_double(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  const double mag = exp == 0 ? std::ldexp(man, -24) : std::ldexp(1024 + man, exp - 25);
  return sign ? -mag : mag;
}

struct RefBlock {
  double d;
  int q[32];
};
RefBlock parse_block(const uint8_t* b) {
  RefBlock r{};
  r.d = half_to_double(static_cast<uint16_t>(b[0] | (b[1] << 8)));
  for (int j = 0; j < 16; ++j) {
    r.q[j] = b[2 + j] & 15;
    r.q[j + 16] = b[2 + j] >> 4;
  }
  return r;
}

// The index of the table value nearest v, in double; `near_tie` set when v lies within 1e-4 of
// a midpoint (where the encoder's float arithmetic may round either way).
int nearest(double v, bool& near_tie) {
  int best = 0;
  for (int k = 1; k < 16; ++k) {
    if (std::fabs(v - kTable[k]) < std::fabs(v - kTable[best])) best = k;
  }
  for (int k = 0; k < 15; ++k) {
    if (std::fabs(v - 0.5 * (kTable[k] + kTable[k + 1])) < 1e-4) near_tie = true;
  }
  return best;
}

// Random rows (uniform, normal, with outliers, at scales 2^-6 .. 2^3) encode to blocks that
// decode to d * table[q] exactly; d is the f16 rounding of the rule's least-squares scale
// computed here in double (d0 = max / -127, q = nearest to x / d0, d = sum(t x) / sum(t^2)); every
// q is the table value nearest x / d; and the result is no worse than the unrefined d0.
TEST(EncodeKvRowIq4Nl, MatchesTheDoubleReference) {
  std::mt19937 rng(20240611);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  constexpr int64_t kBlocks = 64, kElems = kBlocks * 32;
  double sse_total = 0, sse_first = 0, energy = 0;
  int checked_d = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const float scale = std::ldexp(1.0f, trial % 10 - 6);
    std::vector<float> x(kElems);
    for (int64_t i = 0; i < kElems; ++i) {
      float v = trial % 2 ? normal(rng) : uni(rng);
      if (trial % 4 == 3 && i % 37 == 0) v *= 20.0f;  // outliers
      x[static_cast<size_t>(i)] = v * scale;
    }
    std::vector<uint8_t> row(static_cast<size_t>(*ggml_row_bytes(GgmlType::IQ4_NL, kElems)));
    ASSERT_EQ(row.size(), static_cast<size_t>(kBlocks * 18));
    encode_kv_row(GgmlType::IQ4_NL, x.data(), row.data(), kElems);
    std::vector<float> got(kElems);
    decode_kv_rows(GgmlType::IQ4_NL, row.data(), row.size(), 1, kElems, got.data(), best_isa());
    for (int64_t b = 0; b < kBlocks; ++b) {
      SCOPED_TRACE("trial " + std::to_string(trial) + " block " + std::to_string(b));
      const float* xb = x.data() + b * 32;
      const RefBlock r = parse_block(row.data() + b * 18);
      // The reference rule in double.
      double max = 0;
      for (int j = 0; j < 32; ++j) {
        if (std::fabs(xb[j]) > std::fabs(max)) max = xb[j];
      }
      ASSERT_NE(max, 0.0);
      const double d0 = max / -127.0;
      bool tie = false;
      double sumqx = 0, sumq2 = 0, sse0 = 0;
      for (int j = 0; j < 32; ++j) {
        const int t = kTable[nearest(xb[j] / d0, tie)];
        sumqx += t * static_cast<double>(xb[j]);
        sumq2 += t * t;
        sse0 += (xb[j] - d0 * t) * (xb[j] - d0 * t);
      }
      const double d_ls = sumqx / sumq2;
      if (!tie) {
        // f16 keeps 11 significant bits: within half a unit of the last place.
        EXPECT_LE(std::fabs(r.d - d_ls), std::ldexp(std::fabs(d_ls), -11) * 1.001);
        ++checked_d;
      }
      double sse = 0;
      for (int j = 0; j < 32; ++j) {
        const double y = r.d * kTable[r.q[j]];
        // d (11 bits) times a table value (7 bits) is exact in float: the decode is bit-exact.
        ASSERT_EQ(static_cast<double>(got[static_cast<size_t>(b * 32 + j)]), y) << j;
        bool tie_q = false;
        const double v = xb[j] / r.d;
        const int want = nearest(v, tie_q);
        if (!tie_q) {
          ASSERT_EQ(r.q[j], want) << j;
        }
        // Inside the table's range within half its widest gap (24); past its ends (the refined d
        // may put the largest value beyond -127) still within a sixth of the block's largest.
        const double err = std::fabs(xb[j] - y);
        if (v >= -127 && v <= 113) {
          ASSERT_LE(err, 12.0001 * std::fabs(r.d)) << j;
        }
        ASSERT_LE(err, std::fabs(max) / 6) << j;
        sse += (xb[j] - y) * (xb[j] - y);
        energy += static_cast<double>(xb[j]) * xb[j];
      }
      sse_total += sse;
      sse_first += sse0;
    }
  }
  EXPECT_GT(checked_d, 40 * 64 * 9 / 10);
  const double rel_rms = std::sqrt(sse_total / energy);
  std::printf("[iq4_nl] relative rms error %.4f (unrefined %.4f)\n", rel_rms,
              std::sqrt(sse_first / energy));
  EXPECT_LT(sse_total, sse_first);
  EXPECT_LE(rel_rms, 0.14);  // measured 0.122, the outlier blocks dominating
}

// An all-zero block stores d = 0 and decodes to zeros. In a block of one non-zero value that value
// maps to table[0] = -127 and the zeros to table[8] = 1 (d small).
TEST(EncodeKvRowIq4Nl, ZeroAndSingleValueBlocks) {
  std::vector<float> x(64, 0.0f);
  x[32 + 5] = -3.0f;
  std::vector<uint8_t> row(2 * 18, 0xAB);
  encode_kv_row(GgmlType::IQ4_NL, x.data(), row.data(), 64);
  EXPECT_EQ(row[0], 0);
  EXPECT_EQ(row[1], 0);
  std::vector<float> got(64, 1.0f);
  decode_kv_rows(GgmlType::IQ4_NL, row.data(), 18, 2, 32, got.data(), Isa::Scalar);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(got[static_cast<size_t>(j)], 0.0f) << j;
  EXPECT_EQ(row[18 + 2 + 5], 0x80);  // element 5 (low nibble) table[0], element 21 table[8]
  const RefBlock r = parse_block(row.data() + 18);
  EXPECT_EQ(r.q[5], 0);
  for (int j = 0; j < 32; ++j) {
    if (j != 5) {
      EXPECT_EQ(r.q[j], 8) << j;
    }
  }
  EXPECT_NEAR(got[37], -3.0f, 0.01f);
  EXPECT_GT(got[36], 0.0f);
  EXPECT_LT(got[36], 0.03f);
}

}  // namespace
}  // namespace moe::cpu
