// Scalar reference activation conversion with llama.cpp's rounding (quantize_row_q8_0_ref,
// quantize_row_q8_1_ref, quantize_row_q8_K_ref, fp32 -> fp16/bf16 round-to-nearest-even).
#include "kernels/cpu/act_quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/fp16.h"

namespace moe::cpu {
namespace avx2 {
void quantize_q8_k(const float* x, uint8_t* y, int64_t nb);  // act_quant_avx2.cpp
}  // namespace avx2
namespace {

const char* act_format_name(ActFormat f) {
  switch (f) {
    case ActFormat::F32:
      return "f32";
    case ActFormat::F16:
      return "f16";
    case ActFormat::BF16:
      return "bf16";
    case ActFormat::Q8_0:
      return "q8_0";
    case ActFormat::Q8_1:
      return "q8_1";
    case ActFormat::Q8_K:
      return "q8_K";
    case ActFormat::Q8_0U4:
      return "q8_0u4";
  }
  return "unknown";
}

size_t act_block_bytes(ActFormat f) {
  switch (f) {
    case ActFormat::F32:
      return sizeof(float);
    case ActFormat::F16:
    case ActFormat::BF16:
      return sizeof(uint16_t);
    case ActFormat::Q8_0:
      return sizeof(BlockQ8_0);
    case ActFormat::Q8_1:
      return sizeof(BlockQ8_1);
    case ActFormat::Q8_K:
      return sizeof(BlockQ8_K);
    case ActFormat::Q8_0U4:  // per block of a group; act_row_bytes rounds up to whole groups
      return kQ8_0U4GroupBytes / 4;
  }
  throw Error("unknown activation format " + std::to_string(static_cast<int>(f)));
}

// Throws unless n is a non-negative multiple of the format's block size; returns the block count.
int64_t checked_blocks(ActFormat f, int64_t n, const char* what) {
  const int64_t qk = act_block_size(f);
  if (n < 0 || n % qk != 0) {
    throw Error(std::string(what) + ": " + std::to_string(n) +
                " elements is not a multiple of the " + act_format_name(f) + " block size " +
                std::to_string(qk));
  }
  return n / qk;
}

// Round half to even via the 1.5 * 2^23 magic number (llama.cpp's nearest_int); |v| <= 2^22.
inline int nearest_int(float v) {
  const float t = v + 12582912.f;
  const int32_t i = std::bit_cast<int32_t>(t);
  return (i & 0x007FFFFF) - 0x00400000;
}

// Shared by Q8_0 and Q8_1: d = amax/127, qs = roundf(x / d) computed as x * (1/d).
float quantize_block32(const float* x, int8_t* qs) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) {
    amax = std::max(amax, std::fabs(x[j]));
  }
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; ++j) {
    qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
  }
  return d;
}

void quantize_q8_0(const float* x, uint8_t* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    BlockQ8_0 blk{};
    const float d = quantize_block32(x, blk.qs);
    blk.d = fp32_to_fp16(d);
    std::memcpy(y + static_cast<size_t>(i) * sizeof blk, &blk, sizeof blk);
  }
}

// Q8_0's blocks (same d, rounded through fp16, and qs) into Q8_0U4 groups (act_quant.h).
void quantize_q8_0u4(const float* x, uint8_t* y, int64_t nb) {
  for (int64_t g = 0; g < (nb + 3) / 4; ++g) {
    uint8_t* out = y + g * kQ8_0U4GroupBytes;
    float d4[4] = {};
    std::memset(out, 128, kQ8_0U4GroupQs);
    for (int j = 0; j < 4 && 4 * g + j < nb; ++j) {
      int8_t qs[32];
      d4[j] = fp16_to_fp32(fp32_to_fp16(quantize_block32(x + 32 * (4 * g + j), qs)));
      for (int e = 0; e < 32; ++e) {
        out[act_q8_0u4_offset(j, e)] = static_cast<uint8_t>(qs[e] + 128);
      }
    }
    const float ds[8] = {d4[0], d4[1], d4[0], d4[1], d4[2], d4[3], d4[2], d4[3]};
    std::memcpy(out + kQ8_0U4GroupQs, ds, sizeof ds);
  }
}

void quantize_q8_1(const float* x, uint8_t* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    BlockQ8_1 blk{};
    const float d = quantize_block32(x, blk.qs);
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      sum += blk.qs[j];
    }
    blk.d = fp32_to_fp16(d);
    blk.s = fp32_to_fp16(static_cast<float>(sum) * d);
    std::memcpy(y + static_cast<size_t>(i) * sizeof blk, &blk, sizeof blk);
  }
}

void quantize_q8_k(const float* x, uint8_t* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 256) {
    BlockQ8_K blk{};
    float amax = 0.0f;
    float max = 0.0f;  // the element of largest magnitude, with its sign (first one on ties)
    for (int j = 0; j < 256; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax != 0.0f) {
      const float iscale = -127.0f / max;
      for (int j = 0; j < 256; ++j) {
        blk.qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
      }
      for (int g = 0; g < 16; ++g) {
        int sum = 0;
        for (int k = 0; k < 16; ++k) {
          sum += blk.qs[16 * g + k];
        }
        blk.bsums[g] = static_cast<int16_t>(sum);
      }
      blk.d = 1.0f / iscale;
    }
    // amax == 0: d = 0 and all qs/bsums 0 (value-initialised above).
    std::memcpy(y + static_cast<size_t>(i) * sizeof blk, &blk, sizeof blk);
  }
}

}  // namespace

ActFormat act_format_for(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
      return ActFormat::F32;
    case GgmlType::F16:
      return ActFormat::F16;
    case GgmlType::BF16:
      return ActFormat::BF16;
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::IQ4_NL:
    case GgmlType::Q2_0:
      return ActFormat::Q8_0;
    case GgmlType::MXFP4:
      return ActFormat::Q8_0U4;
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
      return ActFormat::Q8_1;
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ4_XS:
      return ActFormat::Q8_K;
    default:
      break;
  }
  throw Error("no activation format for weight type " +
              ggml_type_label(static_cast<uint32_t>(type)) + " (not computable)");
}

int64_t act_block_size(ActFormat f) {
  switch (f) {
    case ActFormat::F32:
    case ActFormat::F16:
    case ActFormat::BF16:
      return 1;
    case ActFormat::Q8_0:
    case ActFormat::Q8_1:
    case ActFormat::Q8_0U4:
      return 32;
    case ActFormat::Q8_K:
      return 256;
  }
  throw Error("unknown activation format " + std::to_string(static_cast<int>(f)));
}

size_t act_row_bytes(ActFormat f, int64_t n) {
  const int64_t nb = checked_blocks(f, n, "act_row_bytes");
  if (f == ActFormat::Q8_0U4) return static_cast<size_t>((nb + 3) / 4 * kQ8_0U4GroupBytes);
  return static_cast<size_t>(nb) * act_block_bytes(f);
}

void quantize_act_row(ActFormat f, const float* x, void* dst, int64_t n, Isa isa) {
  if (f == ActFormat::Q8_K && isa != Isa::Scalar) {
    const int64_t nb = checked_blocks(f, n, "quantize_act_row");
    return avx2::quantize_q8_k(x, static_cast<uint8_t*>(dst), nb);
  }
  quantize_act_row_ref(f, x, dst, n);
}

void quantize_act_row_ref(ActFormat f, const float* x, void* dst, int64_t n) {
  const int64_t nb = checked_blocks(f, n, "quantize_act_row_ref");
  switch (f) {
    case ActFormat::F32:
      if (n > 0) {
        std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
      }
      return;
    case ActFormat::F16: {
      auto* out = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(x[i]);
        std::memcpy(out + 2 * i, &h, sizeof h);
      }
      return;
    }
    case ActFormat::BF16: {
      auto* out = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, sizeof h);
      }
      return;
    }
    case ActFormat::Q8_0:
      return quantize_q8_0(x, static_cast<uint8_t*>(dst), nb);
    case ActFormat::Q8_1:
      return quantize_q8_1(x, static_cast<uint8_t*>(dst), nb);
    case ActFormat::Q8_K:
      return quantize_q8_k(x, static_cast<uint8_t*>(dst), nb);
    case ActFormat::Q8_0U4:
      return quantize_q8_0u4(x, static_cast<uint8_t*>(dst), nb);
  }
}

void dequantize_act_row(ActFormat f, const void* src, float* dst, int64_t n) {
  const int64_t nb = checked_blocks(f, n, "dequantize_act_row");
  const auto* in = static_cast<const uint8_t*>(src);
  switch (f) {
    case ActFormat::F32:
      if (n > 0) {
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      }
      return;
    case ActFormat::F16:
    case ActFormat::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, sizeof h);
        dst[i] = f == ActFormat::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
      }
      return;
    case ActFormat::Q8_0:
      for (int64_t i = 0; i < nb; ++i) {
        BlockQ8_0 blk{};
        std::memcpy(&blk, in + static_cast<size_t>(i) * sizeof blk, sizeof blk);
        const float d = fp16_to_fp32(blk.d);
        for (int j = 0; j < 32; ++j) {
          dst[32 * i + j] = static_cast<float>(blk.qs[j]) * d;
        }
      }
      return;
    case ActFormat::Q8_1:
      for (int64_t i = 0; i < nb; ++i) {
        BlockQ8_1 blk{};
        std::memcpy(&blk, in + static_cast<size_t>(i) * sizeof blk, sizeof blk);
        const float d = fp16_to_fp32(blk.d);
        for (int j = 0; j < 32; ++j) {
          dst[32 * i + j] = static_cast<float>(blk.qs[j]) * d;
        }
      }
      return;
    case ActFormat::Q8_K:
      for (int64_t i = 0; i < nb; ++i) {
        BlockQ8_K blk{};
        std::memcpy(&blk, in + static_cast<size_t>(i) * sizeof blk, sizeof blk);
        for (int j = 0; j < 256; ++j) {
          dst[256 * i + j] = blk.d * static_cast<float>(blk.qs[j]);
        }
      }
      return;
    case ActFormat::Q8_0U4:
      for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* grp = in + i / 4 * kQ8_0U4GroupBytes;
        const int j = static_cast<int>(i % 4);
        float d;
        std::memcpy(&d, grp + kQ8_0U4GroupQs + 4 * (j / 2 * 4 + j % 2), sizeof d);
        for (int e = 0; e < 32; ++e) {
          dst[32 * i + e] = static_cast<float>(grp[act_q8_0u4_offset(j, e)] - 128) * d;
        }
      }
      return;
  }
}

}  // namespace moe::cpu
