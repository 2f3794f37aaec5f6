// Weight quantizers: quantize fresh random rows, decode them with the ggml-exact dequantizer, and
// check every element against the error bound the quantizer promises (half a step of its
// sub-block plus the rounding of the sub-block scales). A wrong bit layout breaks the bound by
// orders of magnitude; the RMS checks catch a quantizer that is valid but needlessly coarse.
#include "kernels/cpu/weight_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/ggml_type.h"
#include "kernels/cpu/dequant.h"

namespace {

using moe::GgmlType;

constexpr int64_t kN = 256 * 24;

// Gaussian values whose magnitude changes per 32-element sub-block (1e-3 .. 10), with some
// sub-blocks all positive, all negative, constant, or zero: the cases where scale and min
// handling differ.
std::vector<float> test_row(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_mag(-3.0f, 1.0f);
  std::vector<float> x(kN);
  for (int64_t s = 0; s < kN / 32; ++s) {
    const float mag = std::pow(10.0f, log_mag(rng));
    for (int64_t i = 0; i < 32; ++i) {
      float v = mag * normal(rng);
      switch (s % 11) {
        case 3:
          v = std::fabs(v);
          break;
        case 5:
          v = -std::fabs(v);
          break;
        case 7:
          v = 0.0f;
          break;
        case 9:
          v = mag;
          break;
        default:
          break;
      }
      x[static_cast<size_t>(s * 32 + i)] = v;
    }
  }
  return x;
}

std::vector<float> round_trip(GgmlType type, const std::vector<float>& x) {
  std::vector<uint8_t> q(*moe::ggml_row_bytes(type, x.size()));
  moe::cpu::quantize_weight_row(type, x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  moe::cpu::dequantize_row(type, q.data(), y.data(), static_cast<int64_t>(x.size()));
  return y;
}

float max_abs(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// The largest error the quantizer allows for element i (see weight_quant.cpp for the schemes).
std::vector<float> error_bounds(GgmlType type, const std::vector<float>& x) {
  std::vector<float> bound(x.size());
  const auto n = static_cast<int64_t>(x.size());
  if (type == GgmlType::Q4_K || type == GgmlType::Q5_K) {
    const float steps = type == GgmlType::Q4_K ? 15.0f : 31.0f;
    for (int64_t b = 0; b < n; b += 256) {
      float range[8], range_max = 0.0f;
      for (int j = 0; j < 8; ++j) {
        const float* s = x.data() + b + 32 * j;
        const float hi = std::max(0.0f, *std::max_element(s, s + 32));
        const float lo = std::min(0.0f, *std::min_element(s, s + 32));
        range[j] = hi - lo;
        range_max = std::max(range_max, range[j]);
      }
      // step_j <= (range_j + dmin) / steps + d, with dmin and d at most a 63rd of the largest.
      for (int j = 0; j < 8; ++j) {
        const float b_j = 0.5f * range[j] / steps + 1.02f * range_max / (63.0f * steps);
        std::fill_n(bound.begin() + b + 32 * j, 32, b_j + 1e-7f);
      }
    }
  } else if (type == GgmlType::Q6_K) {
    for (int64_t b = 0; b < n; b += 256) {
      const float d = max_abs(x.data() + b, 256) / (32.0f * 127.0f) * 1.001f;
      for (int g = 0; g < 16; ++g) {
        // Half a step, or a whole one plus the scale rounding where +32 clamps to +31.
        const float b_g = max_abs(x.data() + b + 16 * g, 16) / 32.0f + 16.0f * d;
        std::fill_n(bound.begin() + b + 16 * g, 16, b_g + 1e-7f);
      }
    }
  } else if (type == GgmlType::MXFP4) {
    for (int64_t b = 0; b < n; b += 32) {
      // The smallest power-of-two scale d whose grid (up to 12d) reaches the largest magnitude:
      // half the widest gap (8d to 12d) is 2d.
      const float a = max_abs(x.data() + b, 32);
      float d = std::ldexp(1.0f, -128);
      while (12.0f * d < a) d *= 2.0f;
      std::fill_n(bound.begin() + b, 32, 2.0f * d);
    }
  } else {
    const float steps = type == GgmlType::Q5_0 ? 16.0f : 127.0f;
    for (int64_t b = 0; b < n; b += 32) {
      // Q5_0 maps the extreme to -16 and clamps +16 to +15 (one whole step). Q8_0 (llama.cpp's
      // reference rounding) codes with the float scale but stores it as fp16: half a step plus
      // 127 times the fp16 rounding of the scale.
      const float a = max_abs(x.data() + b, 32);
      const float m = a / steps * 1.001f;
      std::fill_n(bound.begin() + b, 32,
                  (type == GgmlType::Q5_0 ? m : 0.5f * m + a / 1024.0f) + 1e-7f);
    }
  }
  return bound;
}

class WeightQuant : public ::testing::TestWithParam<GgmlType> {};

TEST_P(WeightQuant, EveryElementWithinItsBound) {
  const GgmlType type = GetParam();
  for (uint32_t seed : {1u, 2u, 3u}) {
    const auto x = test_row(seed);
    const auto y = round_trip(type, x);
    const auto bound = error_bounds(type, x);
    int64_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!(std::fabs(y[i] - x[i]) <= bound[i])) {
        if (++bad <= 5) {
          ADD_FAILURE() << "element " << i << ": x=" << x[i] << " decoded " << y[i] << " bound "
                        << bound[i];
        }
      }
    }
    EXPECT_EQ(bad, 0) << "seed " << seed;
  }
}

TEST_P(WeightQuant, ZeroRowStaysZero) {
  const std::vector<float> x(512, 0.0f);
  for (float v : round_trip(GetParam(), x)) EXPECT_EQ(v, 0.0f);
}

// Relative RMS error on N(0,1) rows, a little above what each format's step size implies.
TEST_P(WeightQuant, GaussianRmsError) {
  const GgmlType type = GetParam();
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kN);
  for (auto& v : x) v = normal(rng);
  const auto y = round_trip(type, x);
  double err = 0.0;
  for (size_t i = 0; i < x.size(); ++i) err += (y[i] - x[i]) * (y[i] - x[i]);
  const double rms = std::sqrt(err / static_cast<double>(x.size()));
  const double limit = type == GgmlType::MXFP4  ? 0.13
                       : type == GgmlType::Q4_K ? 0.13
                       : type == GgmlType::Q5_K ? 0.07
                       : type == GgmlType::Q5_0 ? 0.07
                       : type == GgmlType::Q6_K ? 0.04
                                                : 0.01;
  EXPECT_LT(rms, limit);
  EXPECT_GT(rms, 0.0);  // the row really was quantized
}

INSTANTIATE_TEST_SUITE_P(Types, WeightQuant,
                         ::testing::Values(GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_K,
                                           GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::MXFP4),
                         [](const auto& info) {
                           return std::string(moe::ggml_type_info_or_throw(info.param).name);
                         });

TEST(WeightQuantErrors, RejectsBadLengthAndUnsupportedType) {
  std::vector<float> x(300, 1.0f);
  std::vector<uint8_t> out(4096);
  EXPECT_THROW(moe::cpu::quantize_weight_row(GgmlType::Q4_K, x.data(), out.data(), 300),
               moe::Error);
  EXPECT_THROW(moe::cpu::quantize_weight_row(GgmlType::IQ4_XS, x.data(), out.data(), 256),
               moe::Error);
  EXPECT_FALSE(moe::cpu::can_quantize_weight(GgmlType::Q2_K));
  EXPECT_TRUE(moe::cpu::can_quantize_weight(GgmlType::Q6_K));
}

TEST(WeightQuantErrors, FloatTypesRoundTripExactlyRepresentableValues) {
  std::vector<float> x = {0.5f, -2.0f, 1.25f, 3.0f};
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
    EXPECT_EQ(round_trip(t, x), x) << moe::ggml_type_info_or_throw(t).name;
  }
}

}  // namespace
