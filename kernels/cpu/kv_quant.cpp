// The KV row encoders: F16 and the Q8_0 / Q4_0 reference quantizers.
#include "kernels/cpu/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/fp16.h"
#include "kernels/cpu/act_quant.h"

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

// Q4_0 as llama.cpp's quantize_row_q4_0_ref: the signed value of largest magnitude (the first on
// ties) maps to -8.
void quantize_q4_0(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    const float d = signed_absmax(xb) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* out = dst + b * 18;
    const uint16_t dh = fp32_to_fp16(d);
    std::memcpy(out, &dh, 2);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(xb[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(xb[j + 16] * id + 8.5f));
      out[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Q4_1 / Q5_1 as quantize_row_q4_1_ref / _q5_1_ref: d = (max - min) / (2^bits - 1), m = min,
// q = (x - min) / d rounded half up (Q4_1 capped at 15); Q5's fifth bits in a little-endian u32.
template <int kBits>
void quantize_affine(const float* x, uint8_t* dst, int64_t n) {
  constexpr int kBlock = kBits == 4 ? 20 : 24;
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
    uint8_t* qs = out + (kBits == 4 ? 4 : 8);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      int q0 = static_cast<int>((xb[j] - min) * id + 0.5f);
      int q1 = static_cast<int>((xb[j + 16] - min) * id + 0.5f);
      if (kBits == 4) {
        q0 = std::min(15, q0);
        q1 = std::min(15, q1);
      }
      qs[j] = static_cast<uint8_t>((q0 & 15) | ((q1 & 15) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
    }
    if (kBits == 5) std::memcpy(out + 4, &qh, 4);
  }
}

// Q5_0 as quantize_row_q5_0_ref: the signed value of largest magnitude maps to -16.
void quantize_q5_0(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    const float d = signed_absmax(xb) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* out = dst + b * 22;
    const uint16_t dh = fp32_to_fp16(d);
    std::memcpy(out, &dh, 2);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(31, static_cast<int>(xb[j] * id + 16.5f));
      const int q1 = std::min(31, static_cast<int>(xb[j + 16] * id + 16.5f));
      out[6 + j] = static_cast<uint8_t>((q0 & 15) | ((q1 & 15) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
    }
    std::memcpy(out + 2, &qh, 4);
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
      quantize_q4_0(x, dst, n);
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
      quantize_q5_0(x, dst, n);
      return;
    case GgmlType::Q5_1:
      quantize_affine<5>(x, dst, n);
      return;
    default:
      throw Error("encode_kv_row: " + ggml_type_label(static_cast<uint32_t>(type)) +
                  " is not a KV cache type");
  }
}

}  // namespace moe::cpu
