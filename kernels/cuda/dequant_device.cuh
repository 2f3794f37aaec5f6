// Per-type device decoders of ggml weight blocks (formats.md §2), ported from
// kernels/cpu/dequant.cpp. Every value is computed with the same float operations in the same
// order as the CPU decoder (no fused multiply-add where the CPU rounds twice), so a decoded weight
// is bit-identical to cpu::dequantize_row's.
//
// A decoder splits a row into "units" of kPer consecutive elements (8 for block types, so every
// lane of a warp decodes its own slice of a block; 1 for the float types, whose rows need not be a
// multiple of 8) and decodes unit u of a row with decode(row, u, v). kAlign is the byte alignment
// the decoder's 16/32-bit loads need of every row start. Only .cu files include this.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "common/error.h"
#include "common/ggml_type.h"

namespace moe::cuda::dq {

__device__ __forceinline__ uint32_t ld_u8(const uint8_t* p) { return *p; }
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ float ld_f16(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(ld_u16(p))));
}

// float(u) - bias for 0 <= u < 2^22 and a small integer bias, exact: 2^23 + u is built from its bit
// pattern and one FADD removes 2^23 + bias. Cheaper than an int-to-float conversion, which runs at
// a quarter of the FADD rate.
__device__ __forceinline__ float small_int_to_float(uint32_t u, float bias) {
  return __int_as_float(static_cast<int>(0x4B000000u | u)) - (8388608.0f + bias);
}
// float of a signed byte given as its raw bits.
__device__ __forceinline__ float int8_to_float(uint32_t byte) {
  return small_int_to_float((byte & 0xFFu) ^ 0x80u, 128.0f);
}

// IQ4_NL's non-linear table {-127, -104, ..., 113} packed as bytes, looked up with byte permutes
// (a divergent lookup in __constant__ memory would serialize the warp).
__device__ __forceinline__ float iq4nl_value(uint32_t nib) {
  const uint32_t sel = nib & 7u;
  const uint32_t b = (nib & 8u) ? __byte_perm(0x26190D01u, 0x71594535u, sel)
                                : __byte_perm(0xBFAD9881u, 0xF6EADDCFu, sel);
  return int8_to_float(b);
}

// MXFP4's doubled E2M1 values {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ..., -12}. Built as (v + 12) - 12
// so that code 8 gives +0 as the CPU table does.
__device__ __forceinline__ float mxfp4_value(uint32_t nib) {
  const uint32_t mag = __byte_perm(0x03020100u, 0x0C080604u, nib & 7u) & 0xFFu;
  return small_int_to_float((nib & 8u) ? 12u - mag : 12u + mag, 12.0f);
}

// E8M0 exponent -> 2^(e-128), from its bit pattern (subnormal for e < 2), as the CPU.
__device__ __forceinline__ float e8m0_to_fp32_half(uint32_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : ((e - 1u) << 23);
  return __uint_as_float(bits);
}

// y = a * b - c with two roundings (no FMA), as the CPU computes it.
__device__ __forceinline__ float mul_sub(float a, float b, float c) {
  return __fsub_rn(__fmul_rn(a, b), c);
}

// Nibble t (0..7) of the 8 bytes lo|hi: the low nibble of byte t, or its high one when `high`.
__device__ __forceinline__ uint32_t nib8(uint32_t lo, uint32_t hi, int t, bool high) {
  const uint32_t w = t < 4 ? lo : hi;
  return (w >> (8 * (t & 3) + (high ? 4 : 0))) & 0xFu;
}
// 8 bytes at a 2-byte aligned address as two little-endian words.
__device__ __forceinline__ void ld8_a2(const uint8_t* p, uint32_t& lo, uint32_t& hi) {
  lo = ld_u16(p) | (ld_u16(p + 2) << 16);
  hi = ld_u16(p + 4) | (ld_u16(p + 6) << 16);
}
__device__ __forceinline__ void ld8_a4(const uint8_t* p, uint32_t& lo, uint32_t& hi) {
  lo = ld_u32(p);
  hi = ld_u32(p + 4);
}

// ---- float types: one element per unit --------------------------------------------------------

struct F32 {
  static constexpr int kPer = 1;
  static constexpr int kAlign = 4;
  static __device__ __forceinline__ void decode(const uint8_t* row, int64_t u, float* v) {
    v[0] = reinterpret_cast<const float*>(row)[u];
  }
};
struct F16 {
  static constexpr int kPer = 1;
  static constexpr int kAlign = 2;
  static __device__ __forceinline__ void decode(const uint8_t* row, int64_t u, float* v) {
    v[0] = ld_f16(row + 2 * u);
  }
};
struct BF16 {
  static constexpr int kPer = 1;
  static constexpr int kAlign = 2;
  static __device__ __forceinline__ void decode(const uint8_t* row, int64_t u, float* v) {
    v[0] = __uint_as_float(ld_u16(row + 2 * u) << 16);
  }
};

// ---- block types: 8 elements per unit, decoded as w[t] = scale * q[t] (- min) ------------------
//
// affine(row, u, q, scale, min) gives the unit's codes q[t] as exact small-integer floats and the
// factors that turn them into weights; the GEMV uses it to apply the factors once per unit
// (scale * sum(q x) - min * sum(x)) instead of once per weight. decode() applies them per weight
// with the CPU's roundings. kHasMin: min is not always 0.

// Block and unit-in-block of unit u for blocks of kUnits units of kBytes bytes. Rows have fewer
// than 2^32 units, and unsigned 32-bit arithmetic turns the division into a shift.
template <int kUnits, int kBytes>
__device__ __forceinline__ const uint8_t* unit_block(const uint8_t* row, int64_t u, int& s) {
  const auto uu = static_cast<uint32_t>(u);
  s = static_cast<int>(uu % kUnits);
  return row + static_cast<size_t>(uu / kUnits) * kBytes;
}

// float(byte t of w) - bias, exact: one byte permute builds 2^23 + byte, one FADD removes
// 2^23 + bias.
__device__ __forceinline__ float byte_to_float(uint32_t w, int t, float bias) {
  return __int_as_float(static_cast<int>(__byte_perm(w, 0x4B000000u, 0x7540u + t))) -
         (8388608.0f + bias);
}
// The 8 bytes of lo|hi as floats minus bias.
__device__ __forceinline__ void bytes_to_floats(uint32_t lo, uint32_t hi, float bias, float* q) {
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    q[t] = byte_to_float(lo, t, bias);
    q[t + 4] = byte_to_float(hi, t, bias);
  }
}
// Low (or high) nibbles of the 4 bytes of w, one per byte.
__device__ __forceinline__ uint32_t nibbles(uint32_t w, bool high) {
  return (high ? w >> 4 : w) & 0x0F0F0F0Fu;
}
// Bits 0..3 of b spread to bit 0 of bytes 0..3.
__device__ __forceinline__ uint32_t spread4(uint32_t b) {
  return ((b & 0xFu) * 0x00204081u) & 0x01010101u;
}

// Weights from codes with the CPU's roundings: scale * q, or scale * q - min rounded twice.
template <bool kHasMin>
__device__ __forceinline__ void apply_affine(const float* q, float scale, float min, float* v) {
#pragma unroll
  for (int t = 0; t < 8; ++t) v[t] = kHasMin ? mul_sub(scale, q[t], min) : scale * q[t];
}

// Gives a block decoder its decode() from its affine().
template <class D>
struct BlockDecoder {
  static constexpr int kPer = 8;
  static __device__ __forceinline__ void decode(const uint8_t* row, int64_t u, float* v) {
    float q[8], scale, min;
    D::affine(row, u, q, scale, min);
    apply_affine<D::kHasMin>(q, scale, min, v);
  }
};

// Q8_0: f16 d; int8 qs[32]. w = q * d.
struct Q8_0 : BlockDecoder<Q8_0> {
  static constexpr int kAlign = 2;
  static constexpr bool kHasMin = false;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<4, 34>(row, u, s);
    scale = ld_f16(b);
    min = 0.0f;
    uint32_t lo, hi;
    ld8_a2(b + 2 + 8 * s, lo, hi);
    bytes_to_floats(lo ^ 0x80808080u, hi ^ 0x80808080u, 128.0f, q);  // int8 -> +128 offset
  }
};

// Q4_0: f16 d; u8 qs[16]; elements 0..15 are the low nibbles, 16..31 the high ones. w = (q-8)*d.
struct Q4_0 : BlockDecoder<Q4_0> {
  static constexpr int kAlign = 2;
  static constexpr bool kHasMin = false;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<4, 18>(row, u, s);
    scale = ld_f16(b);
    min = 0.0f;
    uint32_t lo, hi;
    ld8_a2(b + 2 + 8 * (s & 1), lo, hi);
    bytes_to_floats(nibbles(lo, s >= 2), nibbles(hi, s >= 2), 8.0f, q);
  }
};

// Q4_1: f16 d; f16 m; u8 qs[16]; w = q*d + m (min = -m).
struct Q4_1 : BlockDecoder<Q4_1> {
  static constexpr int kAlign = 4;
  static constexpr bool kHasMin = true;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<4, 20>(row, u, s);
    scale = ld_f16(b);
    min = -ld_f16(b + 2);
    uint32_t lo, hi;
    ld8_a4(b + 4 + 8 * (s & 1), lo, hi);
    bytes_to_floats(nibbles(lo, s >= 2), nibbles(hi, s >= 2), 0.0f, q);
  }
};

// Q5_0: f16 d; u32 qh (bit e = 5th bit of element e); u8 qs[16]. w = (q-16)*d.
struct Q5_0 : BlockDecoder<Q5_0> {
  static constexpr int kAlign = 2;
  static constexpr bool kHasMin = false;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<4, 22>(row, u, s);
    scale = ld_f16(b);
    min = 0.0f;
    const uint32_t qh = (ld_u16(b + 2) | (ld_u16(b + 4) << 16)) >> (8 * s);
    uint32_t lo, hi;
    ld8_a2(b + 6 + 8 * (s & 1), lo, hi);
    bytes_to_floats(nibbles(lo, s >= 2) | (spread4(qh) << 4),
                    nibbles(hi, s >= 2) | (spread4(qh >> 4) << 4), 16.0f, q);
  }
};

// Q5_1: f16 d; f16 m; u32 qh; u8 qs[16]; w = q*d + m with unsigned 5-bit q.
struct Q5_1 : BlockDecoder<Q5_1> {
  static constexpr int kAlign = 4;
  static constexpr bool kHasMin = true;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<4, 24>(row, u, s);
    scale = ld_f16(b);
    min = -ld_f16(b + 2);
    const uint32_t qh = ld_u32(b + 4) >> (8 * s);
    uint32_t lo, hi;
    ld8_a4(b + 8 + 8 * (s & 1), lo, hi);
    bytes_to_floats(nibbles(lo, s >= 2) | (spread4(qh) << 4),
                    nibbles(hi, s >= 2) | (spread4(qh >> 4) << 4), 0.0f, q);
  }
};

// IQ4_NL: f16 d; u8 qs[16]; nibbles index the non-linear table. w = d * table[q].
struct IQ4_NL : BlockDecoder<IQ4_NL> {
  static constexpr int kAlign = 2;
  static constexpr bool kHasMin = false;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<4, 18>(row, u, s);
    scale = ld_f16(b);
    min = 0.0f;
    uint32_t lo, hi;
    ld8_a2(b + 2 + 8 * (s & 1), lo, hi);
#pragma unroll
    for (int t = 0; t < 8; ++t) q[t] = iq4nl_value(nib8(lo, hi, t, s >= 2));
  }
};

// MXFP4: u8 e (E8M0); u8 qs[16] of E2M1 codes. 17-byte blocks: byte loads only.
struct MXFP4 : BlockDecoder<MXFP4> {
  static constexpr int kAlign = 1;
  static constexpr bool kHasMin = false;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<4, 17>(row, u, s);
    scale = e8m0_to_fp32_half(ld_u8(b));
    min = 0.0f;
    const uint8_t* qs = b + 1 + 8 * (s & 1);
#pragma unroll
    for (int t = 0; t < 8; ++t) q[t] = mxfp4_value((ld_u8(qs + t) >> (s >= 2 ? 4 : 0)) & 0xFu);
  }
};

// Q2_0 (64 elements): f16 d; u8 qs[16], four 2-bit codes per byte from the low bits;
// codes {0,1,2,3} -> {-1,0,1,2} * d. Unit s is the 16-bit word qs[2s..2s+1].
struct Q2_0 : BlockDecoder<Q2_0> {
  static constexpr int kAlign = 2;
  static constexpr bool kHasMin = false;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<8, 18>(row, u, s);
    scale = ld_f16(b);
    min = 0.0f;
    const uint32_t w = ld_u16(b + 2 + 2 * s);
#pragma unroll
    for (int t = 0; t < 8; ++t) q[t] = small_int_to_float((w >> (2 * t)) & 3u, 1.0f);
  }
};

// ---- 256-element K-quant blocks: 32 units per block --------------------------------------------
// In Q2_K/Q3_K/Q6_K element e of a block sits in half n = e/128, and r = e%128 selects the 32-group
// g = r/32 (a bit shift or nibble) and the byte l = r%32 within the half's 32 bytes.

// Q2_K: u8 scales[16] (low nibble scale, high nibble min); u8 qs[64]; f16 d; f16 dmin.
struct Q2_K : BlockDecoder<Q2_K> {
  static constexpr int kAlign = 4;
  static constexpr bool kHasMin = true;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<32, 84>(row, u, s);
    const int n = s >> 4, g = (s >> 2) & 3, l0 = 8 * (s & 3);
    const uint32_t sc = ld_u8(b + (s >> 1));
    scale = ld_f16(b + 80) * small_int_to_float(sc & 0xFu, 0.0f);
    min = ld_f16(b + 82) * small_int_to_float(sc >> 4, 0.0f);
    uint32_t lo, hi;
    ld8_a4(b + 16 + 32 * n + l0, lo, hi);
    bytes_to_floats((lo >> (2 * g)) & 0x03030303u, (hi >> (2 * g)) & 0x03030303u, 0.0f, q);
  }
};

// Q3_K: u8 hmask[32]; u8 qs[64]; u8 scales[12] (16 signed 6-bit scales); f16 d.
// w = dl * (2-bit q + 4 * hmask bit - 4).
struct Q3_K : BlockDecoder<Q3_K> {
  static constexpr int kAlign = 2;
  static constexpr bool kHasMin = false;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<32, 110>(row, u, s);
    const int n = s >> 4, g = (s >> 2) & 3, l0 = 8 * (s & 3);
    const int is = s >> 1;  // 16-element scale group
    const uint8_t* sc = b + 96;
    // Both candidate bytes are loaded so that lanes of different groups do not diverge.
    const uint32_t lo_byte = ld_u8(sc + (is & 7));
    const uint32_t low4 = is < 8 ? (lo_byte & 0xFu) : (lo_byte >> 4);
    const uint32_t high2 = (ld_u8(sc + 8 + (is & 3)) >> (2 * (is >> 2))) & 3u;
    scale = ld_f16(b + 108) * small_int_to_float(low4 | (high2 << 4), 32.0f);
    min = 0.0f;
    const int hbit = 4 * n + g;
    uint32_t qlo, qhi, hlo, hhi;
    ld8_a2(b + 32 + 32 * n + l0, qlo, qhi);
    ld8_a2(b + l0, hlo, hhi);
    bytes_to_floats(((qlo >> (2 * g)) & 0x03030303u) | (((hlo >> hbit) & 0x01010101u) << 2),
                    ((qhi >> (2 * g)) & 0x03030303u) | (((hhi >> hbit) & 0x01010101u) << 2), 4.0f,
                    q);
  }
};

// 6-bit scale and min j (0..7) of Q4_K/Q5_K from the 12 packed bytes at p (4-byte aligned):
// j < 4: low 6 bits of bytes j and j+4; j >= 4: nibbles of byte j+4 with the top 2 bits of bytes
// j-4 and j. Branch-free (the lanes of a warp decode different j), from three word loads that
// every lane of the block shares.
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* p, uint32_t& sc, uint32_t& mn) {
  const int sh = 8 * (j & 3);
  const uint32_t b0 = (ld_u32(p) >> sh) & 0xFFu;      // byte j (j < 4) or j - 4
  const uint32_t b1 = (ld_u32(p + 4) >> sh) & 0xFFu;  // byte j + 4 (j < 4) or j
  const uint32_t b2 = (ld_u32(p + 8) >> sh) & 0xFFu;  // byte j + 4 (j >= 4)
  if (j < 4) {
    sc = b0 & 63u;
    mn = b1 & 63u;
  } else {
    sc = (b2 & 0xFu) | ((b0 >> 6) << 4);
    mn = (b2 >> 4) | ((b1 >> 6) << 4);
  }
}

// Q4_K: f16 d; f16 dmin; u8 scales[12]; u8 qs[128]. Element e: 64-group k = e/64; j = e%64 < 32
// takes the low nibble of qs[32k + j] with scale 2k, else the high nibble of qs[32k + j-32], 2k+1.
struct Q4_K : BlockDecoder<Q4_K> {
  static constexpr int kAlign = 4;
  static constexpr bool kHasMin = true;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<32, 144>(row, u, s);
    const int k = s >> 3;
    const bool high = (s & 4) != 0;
    const int l0 = 8 * (s & 3);
    uint32_t sc, mn;
    scale_min_k4(2 * k + (high ? 1 : 0), b + 4, sc, mn);
    scale = ld_f16(b) * small_int_to_float(sc, 0.0f);
    min = ld_f16(b + 2) * small_int_to_float(mn, 0.0f);
    uint32_t lo, hi;
    ld8_a4(b + 16 + 32 * k + l0, lo, hi);
    bytes_to_floats(nibbles(lo, high), nibbles(hi, high), 0.0f, q);
  }
};

// Q5_K: f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]. As Q4_K plus a 5th bit from qh[l]
// (bit 2k for the low nibbles, 2k+1 for the high ones).
struct Q5_K : BlockDecoder<Q5_K> {
  static constexpr int kAlign = 4;
  static constexpr bool kHasMin = true;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<32, 176>(row, u, s);
    const int k = s >> 3;
    const bool high = (s & 4) != 0;
    const int l0 = 8 * (s & 3);
    uint32_t sc, mn;
    scale_min_k4(2 * k + (high ? 1 : 0), b + 4, sc, mn);
    scale = ld_f16(b) * small_int_to_float(sc, 0.0f);
    min = ld_f16(b + 2) * small_int_to_float(mn, 0.0f);
    const int hbit = 2 * k + (high ? 1 : 0);
    uint32_t lo, hi, hlo, hhi;
    ld8_a4(b + 48 + 32 * k + l0, lo, hi);
    ld8_a4(b + 16 + l0, hlo, hhi);
    bytes_to_floats(nibbles(lo, high) | (((hlo >> hbit) & 0x01010101u) << 4),
                    nibbles(hi, high) | (((hhi >> hbit) & 0x01010101u) << 4), 0.0f, q);
  }
};

// Q6_K: u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d. w = (d * scale) * (6-bit q - 32).
// Element e: half n, group g, byte l: low 4 bits from ql[64n + l + 32(g&1)] (high nibble when
// g >= 2), top 2 bits from qh[32n + l] bits 2g..2g+1, scale 8n + l/16 + 2g.
struct Q6_K : BlockDecoder<Q6_K> {
  static constexpr int kAlign = 2;
  static constexpr bool kHasMin = false;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<32, 210>(row, u, s);
    const int n = s >> 4, g = (s >> 2) & 3, l0 = 8 * (s & 3);
    scale = ld_f16(b + 208) * int8_to_float(ld_u8(b + 192 + 8 * n + (l0 >> 4) + 2 * g));
    min = 0.0f;
    uint32_t lo, hi, hlo, hhi;
    ld8_a2(b + 64 * n + l0 + 32 * (g & 1), lo, hi);
    ld8_a2(b + 128 + 32 * n + l0, hlo, hhi);
    bytes_to_floats(nibbles(lo, g >= 2) | (((hlo >> (2 * g)) & 0x03030303u) << 4),
                    nibbles(hi, g >= 2) | (((hhi >> (2 * g)) & 0x03030303u) << 4), 32.0f, q);
  }
};

// IQ4_XS: f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; 8 sub-blocks of 32 with 6-bit scales,
// each laid out like an IQ4_NL block.
struct IQ4_XS : BlockDecoder<IQ4_XS> {
  static constexpr int kAlign = 4;
  static constexpr bool kHasMin = false;
  static __device__ __forceinline__ void affine(const uint8_t* row, int64_t u, float* q,
                                                float& scale, float& min) {
    int s;
    const uint8_t* b = unit_block<32, 136>(row, u, s);
    const int ib = s >> 2;
    const int j = s & 3;  // unit within the sub-block: 0,1 low nibbles, 2,3 high
    const uint32_t ls = ((ld_u8(b + 4 + (ib >> 1)) >> (4 * (ib & 1))) & 0xFu) |
                        (((ld_u16(b + 2) >> (2 * ib)) & 3u) << 4);
    scale = ld_f16(b) * small_int_to_float(ls, 32.0f);
    min = 0.0f;
    uint32_t lo, hi;
    ld8_a4(b + 8 + 16 * ib + 8 * (j & 1), lo, hi);
#pragma unroll
    for (int t = 0; t < 8; ++t) q[t] = iq4nl_value(nib8(lo, hi, t, j >= 2));
  }
};

// ---- host-side dispatch ------------------------------------------------------------------------

// Calls f(Decoder{}) for the decoder of t and returns true; false for a type without one.
template <class F>
bool try_dispatch(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::F32:
      f(F32{});
      return true;
    case GgmlType::F16:
      f(F16{});
      return true;
    case GgmlType::BF16:
      f(BF16{});
      return true;
    case GgmlType::Q8_0:
      f(Q8_0{});
      return true;
    case GgmlType::Q4_0:
      f(Q4_0{});
      return true;
    case GgmlType::Q4_1:
      f(Q4_1{});
      return true;
    case GgmlType::Q5_0:
      f(Q5_0{});
      return true;
    case GgmlType::Q5_1:
      f(Q5_1{});
      return true;
    case GgmlType::IQ4_NL:
      f(IQ4_NL{});
      return true;
    case GgmlType::MXFP4:
      f(MXFP4{});
      return true;
    case GgmlType::Q2_0:
      f(Q2_0{});
      return true;
    case GgmlType::Q2_K:
      f(Q2_K{});
      return true;
    case GgmlType::Q3_K:
      f(Q3_K{});
      return true;
    case GgmlType::Q4_K:
      f(Q4_K{});
      return true;
    case GgmlType::Q5_K:
      f(Q5_K{});
      return true;
    case GgmlType::Q6_K:
      f(Q6_K{});
      return true;
    case GgmlType::IQ4_XS:
      f(IQ4_XS{});
      return true;
    default:
      return false;
  }
}

// As try_dispatch, throwing moe::Error (naming `what`) for a type without a decoder.
template <class F>
void dispatch(GgmlType t, const char* what, F&& f) {
  if (!try_dispatch(t, f)) {
    throw Error(std::string(what) + ": type " + ggml_type_label(static_cast<uint32_t>(t)) +
                " is not supported on the GPU");
  }
}

}  // namespace moe::cuda::dq
