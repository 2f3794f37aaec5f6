// Scalar reference dot product: decode both operands to float, accumulate in double. Slow on
// purpose-simple; it is the oracle for every SIMD kernel and the path for CPUs without AVX2.
#include <algorithm>

#include "common/error.h"
#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/vec_dot.h"

namespace moe::cpu {

void vec_dot_ref(GgmlType type, int64_t n, const void* w, const void* act, size_t act_stride,
                 int n_act, float* out) {
  const ActFormat fmt = act_format_for(type);
  // Chunks of 256 elements: a multiple of every weight and activation block size we support,
  // and any row length is a multiple of both blocks, so every chunk boundary is a block boundary.
  constexpr int64_t kChunk = 256;
  float wf[kChunk];
  float af[kChunk];
  double acc[kMaxActRows] = {};
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    const auto w_off = ggml_row_bytes(type, static_cast<uint64_t>(i0));
    if (!w_off) throw Error("vec_dot_ref: row length not a multiple of the block size");
    dequantize_row(type, static_cast<const uint8_t*>(w) + *w_off, wf, len);
    for (int r = 0; r < n_act; ++r) {
      const auto* a = static_cast<const uint8_t*>(act) + r * act_stride + act_row_bytes(fmt, i0);
      dequantize_act_row(fmt, a, af, len);
      double s = 0;
      for (int64_t j = 0; j < len; ++j) s += static_cast<double>(wf[j]) * af[j];
      acc[r] += s;
    }
  }
  for (int r = 0; r < n_act; ++r) out[r] = static_cast<float>(acc[r]);
}

}  // namespace moe::cpu
