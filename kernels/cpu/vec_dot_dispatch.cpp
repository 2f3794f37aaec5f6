#include "kernels/cpu/vec_dot.h"

namespace moe::cpu {

namespace avx2 {
VecDotFn kernel_for(GgmlType type);
}
namespace avx512 {
VecDotFn kernel_for(GgmlType type);
VecDotFn mxfp4_kernel(bool vbmi);
}  // namespace avx512

namespace {

template <GgmlType T>
void ref_kernel(int64_t n, const void* w, const void* act, size_t act_stride, int n_act,
                float* out) {
  vec_dot_ref(T, n, w, act, act_stride, n_act, out);
}

VecDotFn scalar_kernel_for(GgmlType type) {
  switch (type) {
#define MOE_REF(t)  \
  case GgmlType::t: \
    return ref_kernel<GgmlType::t>;
    MOE_REF(F32)
    MOE_REF(F16) MOE_REF(BF16) MOE_REF(Q8_0) MOE_REF(Q4_0) MOE_REF(Q4_1) MOE_REF(Q5_0) MOE_REF(Q5_1)
        MOE_REF(IQ4_NL) MOE_REF(MXFP4) MOE_REF(Q2_0) MOE_REF(Q2_K) MOE_REF(Q3_K) MOE_REF(Q4_K)
            MOE_REF(Q5_K) MOE_REF(Q6_K) MOE_REF(IQ4_XS)
#undef MOE_REF
                default : return nullptr;
  }
}

}  // namespace

VecDotFn vec_dot_kernel(GgmlType type, Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return avx512::kernel_for(type);
    case Isa::Avx2:
      return avx2::kernel_for(type);
    case Isa::Scalar:
      return scalar_kernel_for(type);
  }
  return nullptr;
}

VecDotFn vec_dot_kernel_mxfp4_avx512(bool vbmi) {
  return isa_supported(Isa::Avx512) ? avx512::mxfp4_kernel(vbmi) : nullptr;
}

}  // namespace moe::cpu
