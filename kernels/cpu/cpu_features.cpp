#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace moe::cpu {
namespace {

struct Features {
  bool avx2 = false;
  bool avx512 = false;
  bool avx512vbmi = false;  // with avx512
};

uint64_t read_xcr0() {
  uint32_t lo = 0;
  uint32_t hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

Features detect() {
  Features f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = c & (1u << 12);
  const bool osxsave = c & (1u << 27);
  const bool avx = c & (1u << 28);
  const bool f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool os_zmm = (xcr0 & 0xE6) == 0xE6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = b & (1u << 5);
  const bool bmi2 = b & (1u << 8);
  const bool avx512f = b & (1u << 16);
  const bool avx512dq = b & (1u << 17);
  const bool avx512bw = b & (1u << 30);
  const bool avx512vl = b & (1u << 31);
  const bool avx512vnni = c & (1u << 11);
  f.avx2 = os_ymm && avx2 && fma && f16c && bmi2;
  f.avx512 = f.avx2 && os_zmm && avx512f && avx512dq && avx512bw && avx512vl && avx512vnni;
  f.avx512vbmi = f.avx512 && (c & (1u << 1));
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return true;
    case Isa::Avx2:
      return features().avx2;
    case Isa::Avx512:
      return features().avx512;
  }
  return false;
}

bool avx512_vbmi_supported() {
  // MOE_AVX512_VBMI=0 turns it off (for comparisons), read once.
  static const bool on = [] {
    const char* env = std::getenv("MOE_AVX512_VBMI");
    return features().avx512vbmi && !(env && std::string(env) == "0");
  }();
  return on;
}

Isa best_isa() {
  Isa best = isa_supported(Isa::Avx512) ? Isa::Avx512
             : isa_supported(Isa::Avx2) ? Isa::Avx2
                                        : Isa::Scalar;
  // MOE_ISA lowers the choice (for testing and comparisons); it never raises it.
  if (const char* env = std::getenv("MOE_ISA")) {
    const std::string want = env;
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      if (want == isa_name(isa) && static_cast<int>(isa) < static_cast<int>(best)) best = isa;
    }
  }
  return best;
}

}  // namespace moe::cpu
