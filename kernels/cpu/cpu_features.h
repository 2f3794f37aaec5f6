// Run-time selection of the SIMD instruction set (one binary for AVX2-only and AVX-512 CPUs).
#pragma once

#include <cstdint>
#include <string_view>

namespace moe::cpu {

// Scalar: portable reference. Avx2: AVX2+FMA+F16C. Avx512: AVX-512 F/BW/VL/DQ + VNNI.
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

std::string_view isa_name(Isa isa);

// Best ISA this CPU and OS support (CPUID + XGETBV). MOE_ISA=scalar|avx2|avx512 lowers it.
Isa best_isa();

// True when `isa` can execute here.
bool isa_supported(Isa isa);

namespace detail {
extern const uintptr_t weight_prefetch_ahead;  // see weight_prefetch_ahead()
}  // namespace detail

// How many bytes ahead of its read position a GEMV kernel software-prefetches the weights. A
// one-row GEMV does so much arithmetic per cache line that the out-of-order window alone keeps
// too few DRAM reads in flight, and the right distance depends on the core: a Zen 5 VM streaming
// ~25 GB/s per core needed 6 KiB, while on a Xeon (Sapphire/Granite Rapids class) prefetches
// into L1 that far ahead held Q6_K/Q8_0 at 66% of the read bandwidth and 2 KiB gives 95-100%
// (docs/PERFORMANCE.md). So: 6 KiB on AMD, 2 KiB elsewhere; MOE_PREFETCH_AHEAD=BYTES (64 to
// 65536) overrides it, for tuning on a new machine. A plain variable, read once per row.
inline uintptr_t weight_prefetch_ahead() { return detail::weight_prefetch_ahead; }

}  // namespace moe::cpu
