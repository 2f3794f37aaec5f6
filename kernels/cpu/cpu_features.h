// Run-time selection of the SIMD instruction set (one binary for AVX2-only and AVX-512 CPUs).
#pragma once

#include <string_view>

namespace moe::cpu {

// Scalar: portable reference. Avx2: AVX2+FMA+F16C. Avx512: AVX-512 F/BW/VL/DQ + VNNI.
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

std::string_view isa_name(Isa isa);

// Best ISA this CPU and OS support (CPUID + XGETBV). MOE_ISA=scalar|avx2|avx512 lowers it.
Isa best_isa();

// True when `isa` can execute here.
bool isa_supported(Isa isa);

// True when the Avx512 ISA is supported and the CPU also has AVX512-VBMI (byte permutes: Ice Lake,
// Zen 4 and later; not Skylake-X / Cascade Lake). Kernels that use it keep a variant without.
// MOE_AVX512_VBMI=0 makes it false.
bool avx512_vbmi_supported();

}  // namespace moe::cpu
