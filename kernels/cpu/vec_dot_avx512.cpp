// vec_dot kernels built for AVX-512 (F/BW/VL/DQ) + VNNI. The target is set per function (pragma)
// rather than per file so that no inline function shared with portable code is compiled for this
// ISA.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/vec_dot.h"

#if defined(__clang__)
#pragma clang attribute push(                                                                    \
    __attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#endif

#define MOE_SIMD_VNNI 1

namespace moe::cpu::avx512 {
namespace {
// simd_common.inc must come first.
// clang-format off
#include "kernels/cpu/simd/simd_common.inc"
#include "kernels/cpu/simd/dot_float.inc"
#include "kernels/cpu/simd/dot_block32.inc"
#include "kernels/cpu/simd/dot_mxfp4.inc"
#include "kernels/cpu/simd/dot_kquants.inc"
// clang-format on
}  // namespace

VecDotFn kernel_for(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
      return dot_f32;
    case GgmlType::F16:
      return dot_f16;
    case GgmlType::BF16:
      return dot_bf16;
    case GgmlType::Q8_0:
      return dot_q8_0;
    case GgmlType::Q4_0:
      return dot_q4_0;
    case GgmlType::Q4_1:
      return dot_q4_1;
    case GgmlType::Q5_0:
      return dot_q5_0;
    case GgmlType::Q5_1:
      return dot_q5_1;
    case GgmlType::IQ4_NL:
      return dot_iq4_nl;
    case GgmlType::MXFP4:
      return avx512_vbmi_supported() ? vbmi::dot_mxfp4 : dot_mxfp4;
    case GgmlType::Q2_0:
      return dot_q2_0;
    case GgmlType::Q2_K:
      return dot_q2_K;
    case GgmlType::Q3_K:
      return dot_q3_K;
    case GgmlType::Q4_K:
      return dot_q4_K;
    case GgmlType::Q5_K:
      return dot_q5_K;
    case GgmlType::Q6_K:
      return dot_q6_K;
    case GgmlType::IQ4_XS:
      return dot_iq4_xs;
    default:
      return nullptr;
  }
}

VecDotFn mxfp4_kernel(bool vbmi) {
  if (!vbmi) return dot_mxfp4;
  return avx512_vbmi_supported() ? vbmi::dot_mxfp4 : nullptr;
}

}  // namespace moe::cpu::avx512

#undef MOE_SIMD_VNNI
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
