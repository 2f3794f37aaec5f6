// Q8_K activation conversion with AVX2, bit-identical to quantize_act_row_ref: the same float
// operations element by element (|x| maximum, the first element reaching it, x * (-127 / max),
// round-half-even through the 1.5 * 2^23 constant, min 127) and the same truncation to int8, so
// even denormal or non-finite inputs give the reference's bytes. No FMA in the target: the
// compiler would fuse x * iscale + 1.5 * 2^23 into one rounding. Decode converts a row on the
// calling thread while the pool waits: 2048 elements took ~7.5 us in scalar code.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/act_quant.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,bmi"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,bmi")
#endif

namespace moe::cpu::avx2 {
namespace {

// Sum of the 8 int32 lanes.
int hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// round(v) as llama.cpp's nearest_int, then min(127, .): int32 lanes.
__m256i rounded(__m256 v) {
  const __m256i i = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12582912.f)));
  const __m256i q = _mm256_sub_epi32(_mm256_and_si256(i, _mm256_set1_epi32(0x007FFFFF)),
                                     _mm256_set1_epi32(0x00400000));
  return _mm256_min_epi32(q, _mm256_set1_epi32(127));
}

}  // namespace

void quantize_q8_k(const float* x, uint8_t* y, int64_t nb) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  // Dword order that undoes the in-lane interleaving of the two packs below.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < nb; ++b, x += 256, y += sizeof(BlockQ8_K)) {
    BlockQ8_K blk{};
    // max(|x|, acc) keeps acc where |x| is NaN, as the reference's `ax > amax` does.
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 256; j += 8) {
      m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask), m);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    const float amax = _mm_cvtss_f32(h);
    if (amax != 0.0f) {
      float max = 0.0f;  // the first element whose magnitude is amax, with its sign
      const __m256 va = _mm256_set1_ps(amax);
      for (int j = 0; j < 256; j += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask);
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(a, va, _CMP_EQ_OQ));
        if (mask) {
          max = x[j + static_cast<int>(_tzcnt_u32(static_cast<unsigned>(mask)))];
          break;
        }
      }
      const float iscale = -127.0f / max;
      const __m256 vs = _mm256_set1_ps(iscale);
      for (int j = 0; j < 256; j += 32) {
        __m256i q[4];
        for (int k = 0; k < 4; ++k)
          q[k] = rounded(_mm256_mul_ps(vs, _mm256_loadu_ps(x + j + 8 * k)));
        // Low bytes, as static_cast<int8_t>: unsigned packs of the masked lanes cannot saturate.
        const __m256i ff = _mm256_set1_epi32(0xFF);
        const __m256i p01 =
            _mm256_packus_epi32(_mm256_and_si256(q[0], ff), _mm256_and_si256(q[1], ff));
        const __m256i p23 =
            _mm256_packus_epi32(_mm256_and_si256(q[2], ff), _mm256_and_si256(q[3], ff));
        const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p01, p23), order);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk.qs + j), bytes);
        // Group sums of the stored int8 values (sign-extended low bytes).
        for (int g = 0; g < 2; ++g) {
          const __m256i s0 = _mm256_srai_epi32(_mm256_slli_epi32(q[2 * g], 24), 24);
          const __m256i s1 = _mm256_srai_epi32(_mm256_slli_epi32(q[2 * g + 1], 24), 24);
          blk.bsums[j / 16 + g] = static_cast<int16_t>(hsum_epi32(_mm256_add_epi32(s0, s1)));
        }
      }
      blk.d = 1.0f / iscale;
    }
    std::memcpy(y, &blk, sizeof blk);
  }
}

}  // namespace moe::cpu::avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
