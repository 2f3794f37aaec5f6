// The KV row encoders: F16, BF16, ggml's reference quantizers of Q8_0 / Q4_x / Q5_x, and IQ4_NL.
#include "kernels/cpu/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/fp16.h"
#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/dequant.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace moe::cpu {
namespace {

// The value of largest magnitude of a block of 32, with its sign; the first one on ties.
float signed_absmax(const float* xb) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(xb[j]) > amax) {
      amax = std::fabs(xb[j]);
      max = xb[j];
    }
  }
  return max;
}

// Low nibbles of q[j] and q[j + 16] into qs[j]; returns the fifth bits (bit j of element j), the
// little-endian qh word of the 5-bit types.
uint32_t pack_block(const int* q, uint8_t* qs) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
    qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  return qh;
}

// Q4_0 / Q5_0 as quantize_row_q4_0_ref / _q5_0_ref: the signed value of largest magnitude (the
// first on ties) maps to -8 / -16, q = x / d + 8.5 / 16.5 truncated and capped at 15 / 31.
template <int kBits>
void quantize_signed(const float* x, uint8_t* dst, int64_t n) {
  constexpr int kBlock = kBits == 4 ? 18 : 22, kQs = kBits == 4 ? 2 : 6;
  constexpr int kMax = (1 << kBits) - 1;
  constexpr float kHalf = static_cast<float>(1 << (kBits - 1));
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    const float d = signed_absmax(xb) / -kHalf;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* out = dst + b * kBlock;
    const uint16_t dh = fp32_to_fp16(d);
    std::memcpy(out, &dh, 2);
    int q[32];
    for (int j = 0; j < 32; ++j)
      q[j] = std::min(kMax, static_cast<int>(xb[j] * id + (kHalf + 0.5f)));
    const uint32_t qh = pack_block(q, out + kQs);
    if (kBits == 5) std::memcpy(out + 2, &qh, 4);
  }
}

// Q4_1 / Q5_1 as quantize_row_q4_1_ref / _q5_1_ref: d = (max - min) / (2^bits - 1), m = min,
// q = (x - min) / d rounded half up (Q4_1 capped at 15).
template <int kBits>
void quantize_affine(const float* x, uint8_t* dst, int64_t n) {
  constexpr int kBlock = kBits == 4 ? 20 : 24, kQs = kBits == 4 ? 4 : 8;
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float min = xb[0], max = xb[0];
    for (int j = 1; j < 32; ++j) {
      min = std::min(min, xb[j]);
      max = std::max(max, xb[j]);
    }
    const float d = (max - min) / static_cast<float>((1 << kBits) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* out = dst + b * kBlock;
    const uint16_t dh = fp32_to_fp16(d), mh = fp32_to_fp16(min);
    std::memcpy(out, &dh, 2);
    std::memcpy(out + 2, &mh, 2);
    int q[32];
    for (int j = 0; j < 32; ++j) {
      q[j] = static_cast<int>((xb[j] - min) * id + 0.5f);
      if (kBits == 4) q[j] = std::min(15, q[j]);
    }
    const uint32_t qh = pack_block(q, out + kQs);
    if (kBits == 5) std::memcpy(out + 4, &qh, 4);
  }
}

// IQ4_NL (this project's rule; ggml's own quantizer searches scales and is not reproduced): per
// block of 32, d = max / -127 with max the signed value of largest magnitude (the first on ties),
// each q = the index of the table value nearest x / d (x * (1 / d), the lower index on ties). Then
// one least-squares refinement: d = sum(t[q] x) / sum(t[q]^2), rounded to fp16, and every q picked
// again against that stored d. The products t[q] x are exact in double and summed in the order of
// a warp's xor butterfly (offsets 16, 8, 4, 2, 1), so the GPU's kv_store gives the same bytes.
// An all-zero block stores d = 0 (q = 8, the value 1).
int iq4_nl_index(float v) {
  int q = 0;
  for (int k = 0; k < 15; ++k) {
    // The midpoint of two neighbours is exact in float; v on it takes the lower index.
    q += v > 0.5f * static_cast<float>(kValuesIq4nl[k] + kValuesIq4nl[k + 1]) ? 1 : 0;
  }
  return q;
}

void quantize_iq4_nl(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    const float d0 = signed_absmax(xb) / static_cast<float>(kValuesIq4nl[0]);
    const float id0 = d0 != 0.0f ? 1.0f / d0 : 0.0f;
    int q[32];
    double s[32];
    int sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      q[j] = iq4_nl_index(xb[j] * id0);
      const int t = kValuesIq4nl[q[j]];
      s[j] = static_cast<double>(t) * static_cast<double>(xb[j]);
      sumq2 += t * t;
    }
    for (int m = 16; m > 0; m >>= 1) {
      for (int j = 0; j < m; ++j) s[j] = s[j] + s[j + m];
    }
    const float d1 = d0 != 0.0f ? static_cast<float>(s[0] / static_cast<double>(sumq2)) : 0.0f;
    const uint16_t dh = fp32_to_fp16(d1);
    const float d = fp16_to_fp32(dh);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) q[j] = iq4_nl_index(xb[j] * id);
    uint8_t* out = dst + b * 18;
    std::memcpy(out, &dh, 2);
    pack_block(q, out + 2);
  }
}

}  // namespace

void encode_kv_row(GgmlType type, const float* x, uint8_t* dst, int64_t n) {
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(x[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case GgmlType::Q8_0:
      // The Q8_0 weight block and the Q8_0 activation block are the same format.
      quantize_act_row_ref(ActFormat::Q8_0, x, dst, n);
      return;
    case GgmlType::Q4_0:
      quantize_signed<4>(x, dst, n);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(x[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case GgmlType::Q4_1:
      quantize_affine<4>(x, dst, n);
      return;
    case GgmlType::Q5_0:
      quantize_signed<5>(x, dst, n);
      return;
    case GgmlType::Q5_1:
      quantize_affine<5>(x, dst, n);
      return;
    case GgmlType::IQ4_NL:
      quantize_iq4_nl(x, dst, n);
      return;
    default:
      throw Error("encode_kv_row: " + ggml_type_label(static_cast<uint32_t>(type)) +
                  " is not a KV cache type");
  }
}

#if defined(__x86_64__)
// F16 to F32, 8 values per instruction; the conversion is exact, as the scalar one.
__attribute__((target("avx2,f16c"))) static void f16_rows_f16c(const uint8_t* src, size_t row_bytes,
                                                               int64_t n_rows, int64_t elems,
                                                               float* dst) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const auto* s = src + static_cast<size_t>(r) * row_bytes;
    float* d = dst + r * elems;
    int64_t i = 0;
    for (; i + 8 <= elems; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
      _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
    }
    for (; i < elems; ++i) {
      uint16_t h = 0;
      std::memcpy(&h, s + 2 * i, 2);
      d[i] = fp16_to_fp32(h);
    }
  }
}
#endif

void decode_kv_rows(GgmlType type, const uint8_t* src, size_t row_bytes, int64_t n_rows,
                    int64_t elems, float* dst, Isa isa) {
#if defined(__x86_64__)
  if (type == GgmlType::F16 && isa != Isa::Scalar) {
    f16_rows_f16c(src, row_bytes, n_rows, elems, dst);
    return;
  }
#else
  (void)isa;
#endif
  for (int64_t r = 0; r < n_rows; ++r) {
    dequantize_row(type, src + static_cast<size_t>(r) * row_bytes, dst + r * elems, elems);
  }
}

}  // namespace moe::cpu
