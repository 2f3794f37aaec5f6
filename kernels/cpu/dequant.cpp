// Scalar reference dequantization (formats.md §2.3/§2.4). Every block is read byte-wise (blocks of
// 17/18/22/... bytes are not aligned), and every float is computed with the same operations in the
// same order as ggml's dequantize_row_*, so results are bit-identical.
#include "kernels/cpu/dequant.h"

#include <bit>
#include <cstddef>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/fp16.h"

namespace moe::cpu {
namespace {

static_assert(std::endian::native == std::endian::little, "block fields are read as little-endian");

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline float load_f16(const uint8_t* p) { return fp16_to_fp32(load_u16(p)); }

// E2M1 values doubled (ggml's kvalues_mxfp4); the scale is halved to compensate.
constexpr int8_t kValuesMxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// ---- 32-element blocks -------------------------------------------------------------------------

// Q8_0: f16 d; int8 qs[32].
void block_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) {
    y[j] = static_cast<float>(qs[j]) * d;
  }
}

// Q4_0: f16 d; u8 qs[16]. Low nibbles are elements 0..15, high nibbles 16..31.
void block_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    const int x0 = (qs[j] & 0x0F) - 8;
    const int x1 = (qs[j] >> 4) - 8;
    y[j] = static_cast<float>(x0) * d;
    y[j + 16] = static_cast<float>(x1) * d;
  }
}

// Q4_1: f16 d; f16 m; u8 qs[16]. y = q*d + m.
void block_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    const int x0 = qs[j] & 0x0F;
    const int x1 = qs[j] >> 4;
    y[j] = static_cast<float>(x0) * d + m;
    y[j + 16] = static_cast<float>(x1) * d + m;
  }
}

// Q5_0: f16 d; u8 qh[4] (LE u32, bit j = 5th bit of element j); u8 qs[16].
void block_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint32_t qh = load_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    const int x0 = ((qs[j] & 0x0F) | h0) - 16;
    const int x1 = ((qs[j] >> 4) | h1) - 16;
    y[j] = static_cast<float>(x0) * d;
    y[j + 16] = static_cast<float>(x1) * d;
  }
}

// Q5_1: f16 d; f16 m; u8 qh[4]; u8 qs[16]. y = q*d + m with unsigned 5-bit q.
void block_q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint32_t qh = load_u32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    const int x0 = (qs[j] & 0x0F) | h0;
    const int x1 = (qs[j] >> 4) | h1;
    y[j] = static_cast<float>(x0) * d + m;
    y[j + 16] = static_cast<float>(x1) * d + m;
  }
}

// IQ4_NL: f16 d; u8 qs[16]; nibbles index the non-linear table.
void block_iq4_nl(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kValuesIq4nl[qs[j] & 0x0F]);
    y[j + 16] = d * static_cast<float>(kValuesIq4nl[qs[j] >> 4]);
  }
}

// E8M0 exponent -> 2^(e-128) (i.e. 2^(e-127) * 0.5), built from its bit pattern. e = 0 and 1 give
// the subnormals 2^-128 and 2^-127; e = 255 gives 2^127 (no NaN).
float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  return std::bit_cast<float>(bits);
}

// MXFP4: u8 e (E8M0); u8 qs[16] of E2M1 codes.
void block_mxfp4(const uint8_t* b, float* y) {
  const float d = e8m0_to_fp32_half(b[0]);
  const uint8_t* qs = b + 1;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(kValuesMxfp4[qs[j] & 0x0F]) * d;
    y[j + 16] = static_cast<float>(kValuesMxfp4[qs[j] >> 4]) * d;
  }
}

// Q2_0 (64 elements): f16 d; u8 qs[16], four 2-bit codes per byte, element 0 in the low bits;
// codes {0,1,2,3} -> {-1,0,1,2} * d.
void block_q2_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 64; ++j) {
    const int c = (qs[j / 4] >> (2 * (j % 4))) & 3;
    y[j] = static_cast<float>(c - 1) * d;
  }
}

// ---- 256-element K-quant blocks ----------------------------------------------------------------

// Q2_K: u8 scales[16] (low nibble scale, high nibble min); u8 qs[64]; f16 d; f16 dmin.
void block_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = load_f16(b + 80);
  const float dmin = load_f16(b + 82);
  int is = 0;
  for (int n = 0; n < 2; ++n) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0x0F);
        const float ml = dmin * static_cast<float>(sc >> 4);
        const uint8_t* qq = q + static_cast<ptrdiff_t>(16 * half);
        for (int l = 0; l < 16; ++l) {
          *y++ = dl * static_cast<float>((qq[l] >> shift) & 3) - ml;
        }
      }
    }
    q += 32;
  }
}

// Q3_K: u8 hmask[32]; u8 qs[64]; u8 scales[12] (16 signed 6-bit scales); f16 d.
void block_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* q = b + 32;
  const uint8_t* sc = b + 96;
  const float d_all = load_f16(b + 108);
  int scales[16];
  for (int i = 0; i < 16; ++i) {
    const int low4 = i < 8 ? (sc[i] & 0x0F) : (sc[i - 8] >> 4);
    const int high2 = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    scales[i] = (low4 | (high2 << 4)) - 32;
  }
  int is = 0;
  unsigned m = 1;
  for (int n = 0; n < 2; ++n) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const float dl = d_all * static_cast<float>(scales[is++]);
        const uint8_t* qq = q + static_cast<ptrdiff_t>(16 * half);
        const uint8_t* hm = hmask + static_cast<ptrdiff_t>(16 * half);
        for (int l = 0; l < 16; ++l) {
          const int v = ((qq[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
      m <<= 1;
    }
    q += 32;
  }
}

// 6-bit scale and min j (0..7) of Q4_K/Q5_K from the 12 packed bytes.
inline void scale_min_k4(int j, const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Q4_K: f16 d; f16 dmin; u8 scales[12]; u8 qs[128].
void block_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int k = 0; k < 4; ++k) {
    uint8_t sc = 0;
    uint8_t mn = 0;
    scale_min_k4(2 * k, scales, &sc, &mn);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(mn);
    scale_min_k4(2 * k + 1, scales, &sc, &mn);
    const float d2 = d * static_cast<float>(sc);
    const float m2 = dmin * static_cast<float>(mn);
    for (int l = 0; l < 32; ++l) {
      *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
    q += 32;
  }
}

// Q5_K: f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128].
void block_q5_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  for (int k = 0; k < 4; ++k) {
    uint8_t sc = 0;
    uint8_t mn = 0;
    scale_min_k4(2 * k, scales, &sc, &mn);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(mn);
    scale_min_k4(2 * k + 1, scales, &sc, &mn);
    const float d2 = d * static_cast<float>(sc);
    const float m2 = dmin * static_cast<float>(mn);
    const unsigned u1 = 1u << (2 * k);
    const unsigned u2 = 2u << (2 * k);
    for (int l = 0; l < 32; ++l) {
      const int v = (ql[l] & 0x0F) + ((qh[l] & u1) ? 16 : 0);
      *y++ = d1 * static_cast<float>(v) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int v = (ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0);
      *y++ = d2 * static_cast<float>(v) - m2;
    }
    ql += 32;
  }
}

// Q6_K: u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d. y = (d * scale) * q.
void block_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int n = 0; n < 2; ++n) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// IQ4_XS: f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; 8 sub-blocks of 32 with 6-bit scales.
void block_iq4_xs(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const unsigned scales_h = load_u16(b + 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F) |
                   static_cast<int>(((scales_h >> (2 * ib)) & 3u) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kValuesIq4nl[qs[j] & 0x0F]);
      y[j + 16] = dl * static_cast<float>(kValuesIq4nl[qs[j] >> 4]);
    }
    y += 32;
    qs += 16;
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

template <BlockFn F>
void run_blocks(const uint8_t* src, float* dst, int64_t nb, size_t block_bytes, int64_t qk) {
  for (int64_t i = 0; i < nb; ++i) {
    F(src + static_cast<size_t>(i) * block_bytes, dst + i * qk);
  }
}

}  // namespace

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const uint32_t id = static_cast<uint32_t>(type);
  const auto info = ggml_type_info(id);
  if (!info || !info->computable) {
    throw Error("dequantize_row: type " + ggml_type_label(id) + " is not supported");
  }
  const int64_t qk = info->block_size;
  if (n < 0 || n % qk != 0) {
    throw Error("dequantize_row: " + std::to_string(n) + " elements of type " +
                ggml_type_label(id) + " is not a multiple of its block size " + std::to_string(qk));
  }
  const auto* s = static_cast<const uint8_t*>(src);
  const int64_t nb = n / qk;
  const size_t bs = info->type_size;
  switch (type) {
    case GgmlType::F32:
      if (n > 0) {
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      }
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = fp16_to_fp32(load_u16(s + 2 * i));
      }
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = bf16_to_fp32(load_u16(s + 2 * i));
      }
      return;
    case GgmlType::Q8_0:
      return run_blocks<block_q8_0>(s, dst, nb, bs, qk);
    case GgmlType::Q4_0:
      return run_blocks<block_q4_0>(s, dst, nb, bs, qk);
    case GgmlType::Q4_1:
      return run_blocks<block_q4_1>(s, dst, nb, bs, qk);
    case GgmlType::Q5_0:
      return run_blocks<block_q5_0>(s, dst, nb, bs, qk);
    case GgmlType::Q5_1:
      return run_blocks<block_q5_1>(s, dst, nb, bs, qk);
    case GgmlType::IQ4_NL:
      return run_blocks<block_iq4_nl>(s, dst, nb, bs, qk);
    case GgmlType::MXFP4:
      return run_blocks<block_mxfp4>(s, dst, nb, bs, qk);
    case GgmlType::Q2_0:
      return run_blocks<block_q2_0>(s, dst, nb, bs, qk);
    case GgmlType::Q2_K:
      return run_blocks<block_q2_k>(s, dst, nb, bs, qk);
    case GgmlType::Q3_K:
      return run_blocks<block_q3_k>(s, dst, nb, bs, qk);
    case GgmlType::Q4_K:
      return run_blocks<block_q4_k>(s, dst, nb, bs, qk);
    case GgmlType::Q5_K:
      return run_blocks<block_q5_k>(s, dst, nb, bs, qk);
    case GgmlType::Q6_K:
      return run_blocks<block_q6_k>(s, dst, nb, bs, qk);
    case GgmlType::IQ4_XS:
      return run_blocks<block_iq4_xs>(s, dst, nb, bs, qk);
    default:
      break;
  }
  // A type marked computable in common/ggml_type.cpp without a decoder here.
  throw Error("dequantize_row: no decoder for type " + ggml_type_label(id));
}

}  // namespace moe::cpu
