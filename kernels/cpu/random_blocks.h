// Random but valid quantized rows for kernel tests: random payload bytes, with every scale field
// set to a finite value of realistic magnitude (random fp16 bits could be NaN or Inf).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "common/ggml_type.h"

namespace moe::test {

struct ScaleField {
  uint32_t offset;  // byte offset inside the block
  bool bf16 = false;
};

// Offsets of the fp16 scale fields of each block type (formats.md §2.2).
inline std::vector<ScaleField> scale_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
    case GgmlType::Q2_0:
      return {{0}};
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
      return {{0}, {2}};
    case GgmlType::Q2_K:
      return {{80}, {82}};
    case GgmlType::Q3_K:
      return {{108}};
    case GgmlType::Q6_K:
      return {{208}};
    default:
      return {};
  }
}

// n elements of type t (n a multiple of the block size).
inline std::vector<uint8_t> random_row(GgmlType t, int64_t n, std::mt19937& rng) {
  const auto info = ggml_type_info_or_throw(t);
  const auto bytes = ggml_row_bytes(t, static_cast<uint64_t>(n));
  if (!bytes) throw Error("random_row: bad length");
  std::vector<uint8_t> row(*bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(0.002f, 0.02f);
  if (t == GgmlType::F32) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = normal(rng);
      std::memcpy(row.data() + 4 * i, &v, 4);
    }
    return row;
  }
  if (t == GgmlType::F16 || t == GgmlType::BF16) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = normal(rng);
      const uint16_t h = t == GgmlType::F16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
      std::memcpy(row.data() + 2 * i, &h, 2);
    }
    return row;
  }
  for (auto& b : row) b = static_cast<uint8_t>(byte(rng));
  const size_t n_blocks = row.size() / info.type_size;
  for (size_t b = 0; b < n_blocks; ++b) {
    uint8_t* block = row.data() + b * info.type_size;
    if (t == GgmlType::MXFP4) {
      block[0] = static_cast<uint8_t>(118 + byte(rng) % 20);  // E8M0 scale 2^-10 .. 2^9 (x0.5)
      continue;
    }
    for (const auto& f : scale_fields(t)) {
      const float s = (byte(rng) & 1 ? 1.0f : -1.0f) * mag(rng);
      const uint16_t h = fp32_to_fp16(s);
      std::memcpy(block + f.offset, &h, 2);
    }
  }
  return row;
}

inline std::vector<float> random_floats(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = normal(rng);
  return v;
}

// Every type our kernels compute with.
// Normalized error a GPU weight product of `rows` rows (the most of any group) must stay within:
// products of more than 8 rows with quantized weights run on FP16 tensor cores (operands rounded
// to FP16: ~2^-11 relative per product; the opt-in int8 product has its own test), everything
// else in FP32.
inline double gpu_product_tolerance(GgmlType t, int64_t rows) {
  const bool block = ggml_type_info_or_throw(t).block_size > 1;
  return block && rows > 8 ? 2e-3 : 1e-5;
}

inline std::vector<GgmlType> computable_types() {
  std::vector<GgmlType> out;
  for (uint32_t id = 0; id < 64; ++id) {
    const auto info = ggml_type_info(id);
    if (info && info->computable) out.push_back(static_cast<GgmlType>(id));
  }
  return out;
}

}  // namespace moe::test
