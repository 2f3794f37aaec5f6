// Dot products of quantized weight rows with activation rows, per (type x ISA).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/ggml_type.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/weight_prefetch.h"

namespace moe::cpu {

inline constexpr int kMaxActRows = 8;

// out[r] = dot(weight row w, activation row r) for r in [0, n_act), 1 <= n_act <= kMaxActRows.
// n: elements per row (a multiple of the weight type's block size and of the activation block).
// act: activation rows in act_format_for(type), act_stride bytes apart.
// The weight row is decoded once and reused for every activation row (this is what lets a
// multi-token GEMV read the weights once).
using VecDotFn = void (*)(int64_t n, const void* w, const void* act, size_t act_stride, int n_act,
                          float* out);

// Kernel for (type, isa), or nullptr when the type is not computable. Every computable type has
// a kernel for every supported ISA.
VecDotFn vec_dot_kernel(GgmlType type, Isa isa);

// The AVX-512 MXFP4 kernel without or with AVX512-VBMI (vec_dot_kernel gives the VBMI one where
// avx512_vbmi_supported()); for tests of both. nullptr for vbmi on a CPU without it.
VecDotFn vec_dot_kernel_mxfp4_avx512(bool vbmi);

// Scalar reference: decodes both operands to float and accumulates in double.
void vec_dot_ref(GgmlType type, int64_t n, const void* w, const void* act, size_t act_stride,
                 int n_act, float* out);
}  // namespace moe::cpu
