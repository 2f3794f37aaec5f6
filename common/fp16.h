// Exact conversions between float32 and IEEE binary16 / bfloat16, bit for bit as ggml does them.
#pragma once

#include <bit>
#include <cstdint>

namespace moe {

// binary16 -> float32, exact for every input (subnormals, infinities and NaNs included).
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits = 0;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal: normalise the mantissa.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// float32 -> binary16 with round-to-nearest-even (what F16C's vcvtps2ph does with imm 0).
inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7FFFFFFFu;
  if (absx > 0x7F800000u)
    return static_cast<uint16_t>(sign | 0x7E00u | ((absx >> 13) & 0x3FFu));  // NaN
  if (absx >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);     // overflow -> inf
  if (absx < 0x38800000u) {
    // Result is subnormal or zero: shift the implicit-1 mantissa into place, rounding to even.
    if (absx < 0x33000000u)
      return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15
  r = (r + 0xFFFu + ((r >> 13) & 1u)) >> 13;
  return static_cast<uint16_t>(sign | r);
}

inline float bf16_to_fp32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// float32 -> bfloat16, round-to-nearest-even; NaN stays a quiet NaN (as ggml_compute_fp32_to_bf16).
inline uint16_t fp32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 64u);
  return static_cast<uint16_t>((x + (0x7FFFu + ((x >> 16) & 1u))) >> 16);
}

}  // namespace moe
