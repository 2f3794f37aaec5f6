#include "kernels/cpu/weight_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/fp16.h"
#include "kernels/cpu/act_quant.h"

namespace moe::cpu {
namespace {

// The smallest fp16 value >= x (x >= 0), so a scale rounded to fp16 never shrinks the grid below
// what the block needs (values at the block's edge then need no clamping).
uint16_t fp16_at_least(float x) {
  uint16_t h = fp32_to_fp16(x);
  if (fp16_to_fp32(h) < x) ++h;  // positive fp16 bit patterns are ordered like their values
  return h;
}

int round_clamp(float v, int lo, int hi) {
  return std::clamp(static_cast<int>(std::lround(v)), lo, hi);
}

// Q5_0: 32 elements, y = d * (q - 16). The element of largest magnitude maps to q = 0 exactly
// (d takes its sign), which is how llama.cpp spends the asymmetric 5-bit range.
void block_q5_0(const float* x, uint8_t* b) {
  float vmax = 0.0f;
  for (int i = 0; i < 32; ++i) {
    if (std::fabs(x[i]) > std::fabs(vmax)) vmax = x[i];
  }
  const uint16_t dh = fp32_to_fp16(vmax / -16.0f);
  const float d = fp16_to_fp32(dh);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  uint32_t qh = 0;
  uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int q0 = round_clamp(x[j] * id + 16.0f, 0, 31);
    const int q1 = round_clamp(x[j + 16] * id + 16.0f, 0, 31);
    qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
    qh |= static_cast<uint32_t>(q0 >> 4) << j;
    qh |= static_cast<uint32_t>(q1 >> 4) << (j + 16);
  }
  std::memcpy(b, &dh, 2);
  std::memcpy(b + 2, &qh, 4);
}

// MXFP4: 32 elements, y = d * v with v an E2M1 value (doubled: 0, 1, 2, 3, 4, 6, 8, 12, and their
// negatives) and d = 2^(e - 128) from the E8M0 byte e. e is the smallest exponent whose grid
// reaches the block's largest magnitude, so nothing clamps; each value takes the nearest grid
// point (the lower magnitude on a tie). Error <= half the widest gap, 2d.
void block_mxfp4(const float* x, uint8_t* b) {
  constexpr float kGrid[8] = {0, 1, 2, 3, 4, 6, 8, 12};
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  int e = 0;
  if (amax > 0.0f) {
    int k = 0;
    std::frexp(amax / 12.0f, &k);  // amax / 12 < 2^k
    e = std::clamp(k + 128, 0, 254);
    while (e > 0 && 12.0f * std::ldexp(1.0f, e - 1 - 128) >= amax) --e;
    while (e < 254 && 12.0f * std::ldexp(1.0f, e - 128) < amax) ++e;
  }
  const float d = std::ldexp(1.0f, e - 128);
  const auto code = [&](float v) {
    const float a = std::fabs(v) / d;
    int best = 0;
    for (int c = 1; c < 8; ++c) {
      if (std::fabs(kGrid[c] - a) < std::fabs(kGrid[best] - a)) best = c;
    }
    return static_cast<uint8_t>(best | (v < 0.0f && best > 0 ? 8 : 0));
  };
  b[0] = static_cast<uint8_t>(e);
  for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(code(x[j]) | code(x[j + 16]) << 4);
}

// Q4_K / Q5_K: 256 elements in 8 sub-blocks of 32, y = d*sc_j*q - dmin*m_j with 6-bit sc_j, m_j
// and unsigned q of `bits` bits. Returns the codes in q[256]; writes d, dmin and the 12 packed
// scale bytes to the block head.
void kquant_scales_and_codes(const float* x, int levels, uint8_t* head, uint8_t* q) {
  float lo[8], hi[8], dmin_max = 0.0f;
  for (int j = 0; j < 8; ++j) {
    lo[j] = 0.0f;  // the min term is subtracted, so the grid always reaches down to <= 0
    hi[j] = x[32 * j];
    for (int i = 0; i < 32; ++i) {
      lo[j] = std::min(lo[j], x[32 * j + i]);
      hi[j] = std::max(hi[j], x[32 * j + i]);
    }
    dmin_max = std::max(dmin_max, -lo[j]);
  }
  const uint16_t dmin_h = fp16_at_least(dmin_max / 63.0f);
  const float dmin = fp16_to_fp32(dmin_h);
  int mq[8];
  float offset[8], need[8], need_max = 0.0f;
  for (int j = 0; j < 8; ++j) {
    mq[j] = dmin > 0.0f ? std::min(63, static_cast<int>(std::ceil(-lo[j] / dmin))) : 0;
    offset[j] = dmin * static_cast<float>(mq[j]);
    need[j] = std::max(0.0f, (hi[j] + offset[j]) / static_cast<float>(levels - 1));
    need_max = std::max(need_max, need[j]);
  }
  const uint16_t d_h = fp16_at_least(need_max / 63.0f);
  const float d = fp16_to_fp32(d_h);
  int sq[8];
  for (int j = 0; j < 8; ++j) {
    sq[j] = d > 0.0f ? std::min(63, static_cast<int>(std::ceil(need[j] / d))) : 0;
    const float step = d * static_cast<float>(sq[j]);
    const float inv = step > 0.0f ? 1.0f / step : 0.0f;
    for (int i = 0; i < 32; ++i) {
      q[32 * j + i] =
          static_cast<uint8_t>(round_clamp((x[32 * j + i] + offset[j]) * inv, 0, levels - 1));
    }
  }
  std::memcpy(head, &d_h, 2);
  std::memcpy(head + 2, &dmin_h, 2);
  // Packing: bytes 0-3 hold sc0-3 (low 6 bits) and the top 2 bits of sc4-7; bytes 4-7 the same
  // for the mins; bytes 8-11 the low nibbles of sc4-7 and m4-7.
  uint8_t* s = head + 4;
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(sq[j] | ((sq[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>(mq[j] | ((mq[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sq[j + 4] & 0x0F) | ((mq[j + 4] & 0x0F) << 4));
  }
}

void block_q4_k(const float* x, uint8_t* b) {
  uint8_t q[256];
  kquant_scales_and_codes(x, 16, b, q);
  uint8_t* qs = b + 16;
  // Each 64-element chunk: low nibbles = its first sub-block, high nibbles = its second.
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
  }
}

void block_q5_k(const float* x, uint8_t* b) {
  uint8_t q[256];
  kquant_scales_and_codes(x, 32, b, q);
  uint8_t* qh = b + 16;
  uint8_t* qs = b + 48;
  std::memset(qh, 0, 32);
  // As Q4_K for the low 4 bits; bit 4 of sub-block j's element l is bit j of qh[l].
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int q0 = q[64 * c + l], q1 = q[64 * c + 32 + l];
      qs[32 * c + l] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh[l] = static_cast<uint8_t>(qh[l] | ((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
    }
  }
}

// Q6_K: 256 elements in 16 groups of 16, y = d * sc_g * (q - 32) with int8 sc_g and 6-bit q.
// Each group's largest-magnitude element maps to q - 32 = -32 (its scale takes the sign).
void block_q6_k(const float* x, uint8_t* b) {
  float gscale[16], smax = 0.0f;
  for (int g = 0; g < 16; ++g) {
    float vmax = 0.0f;
    for (int i = 0; i < 16; ++i) {
      if (std::fabs(x[16 * g + i]) > std::fabs(vmax)) vmax = x[16 * g + i];
    }
    gscale[g] = vmax / -32.0f;
    smax = std::max(smax, std::fabs(gscale[g]));
  }
  const uint16_t d_h = fp16_at_least(smax / 127.0f);
  const float d = fp16_to_fp32(d_h);
  auto* scales = reinterpret_cast<int8_t*>(b + 192);
  int8_t q[256];
  for (int g = 0; g < 16; ++g) {
    const int sc = d > 0.0f ? round_clamp(gscale[g] / d, -127, 127) : 0;
    scales[g] = static_cast<int8_t>(sc);
    const float step = d * static_cast<float>(sc);
    const float inv = step != 0.0f ? 1.0f / step : 0.0f;
    for (int i = 0; i < 16; ++i) {
      q[16 * g + i] = static_cast<int8_t>(round_clamp(x[16 * g + i] * inv, -32, 31));
    }
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  // Per 128-element half: ql[l] = elements l (low) and l+64 (high nibble), ql[l+32] = l+32 and
  // l+96; qh[l] holds the top 2 bits of l, l+32, l+64, l+96 in that order.
  for (int h = 0; h < 2; ++h) {
    const int8_t* qq = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      const int q1 = qq[l] + 32, q2 = qq[l + 32] + 32, q3 = qq[l + 64] + 32, q4 = qq[l + 96] + 32;
      ql[l] = static_cast<uint8_t>((q1 & 0x0F) | ((q3 & 0x0F) << 4));
      ql[l + 32] = static_cast<uint8_t>((q2 & 0x0F) | ((q4 & 0x0F) << 4));
      qh[l] =
          static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
    }
    ql += 64;
    qh += 32;
  }
  std::memcpy(b + 208, &d_h, 2);
}

template <void (*Block)(const float*, uint8_t*)>
void run_blocks(const float* x, uint8_t* dst, int64_t n, int64_t qk, int64_t bytes) {
  for (int64_t i = 0; i < n / qk; ++i) Block(x + i * qk, dst + i * bytes);
}

}  // namespace

bool can_quantize_weight(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::Q5_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::MXFP4:
      return true;
    default:
      return false;
  }
}

void quantize_weight_row(GgmlType type, const float* x, void* dst, int64_t n) {
  const GgmlTypeInfo& info = ggml_type_info_or_throw(type);
  const std::string name(info.name);
  if (!can_quantize_weight(type)) throw Error("no weight quantizer for type " + name);
  const int64_t qk = info.block_size, bytes = info.type_size;
  if (n < 0 || n % qk != 0) {
    throw Error("cannot quantize " + std::to_string(n) + " elements as " + name + " (blocks of " +
                std::to_string(qk) + ")");
  }
  auto* out = static_cast<uint8_t*>(dst);
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
      // These weight layouts are the activation formats' (act_quant.h), same rounding.
      return quantize_act_row_ref(act_format_for(type), x, out, n);
    case GgmlType::Q5_0:
      return run_blocks<block_q5_0>(x, out, n, qk, bytes);
    case GgmlType::Q4_K:
      return run_blocks<block_q4_k>(x, out, n, qk, bytes);
    case GgmlType::Q5_K:
      return run_blocks<block_q5_k>(x, out, n, qk, bytes);
    case GgmlType::Q6_K:
      return run_blocks<block_q6_k>(x, out, n, qk, bytes);
    case GgmlType::MXFP4:
      return run_blocks<block_mxfp4>(x, out, n, qk, bytes);
    default:
      break;
  }
}

}  // namespace moe::cpu
