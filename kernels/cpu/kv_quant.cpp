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

// Q4_0 as llama.cpp's quantize_row_q4_0_ref: the signed value of largest magnitude (the first on
// ties) maps to -8.
void quantize_q4_0(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
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
    default:
      throw Error("encode_kv_row: " + ggml_type_label(static_cast<uint32_t>(type)) +
                  " is not a KV cache type");
  }
}

}  // namespace moe::cpu
