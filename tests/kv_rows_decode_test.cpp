// cpu::decode_kv_rows (how the CPU attention reads the KV cache) gives dequantize_row's bits on
// every ISA this machine has: F16 through F16C for every one of the 65,536 half values (NaNs stay
// NaN), rows at a stride wider than their values and a tail shorter than a vector; the other
// cache types through the reference decoder.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
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
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0}) {
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

}  // namespace
}  // namespace moe::cpu
