// Internal: the int8 tensor-core weight product for batches of quantized weights (prefill), used by
// launch_weight_product_typed() for block types (sm_80+: m16n8k32 / m16n8k16; sm_75, Turing: the
// same fragments through m8n8k16); the FP16 kernel of matmul_mma.cuh stays for MOE_CUDA_MMQ=0.
// Included by matmul_kernels.cuh only.
//
// Why: the FP16 kernel decodes every weight to a float, rounds it to FP16 and multiplies on the
// FP16 tensor cores; decoding dominated a prefill (60% of its kernel time in the Q4_K product).
// Here a weight unit (8 codes) becomes 8 int8 codes with a few integer operations, activations are
// quantized to int8 once per tile, and the int8 tensor cores (twice the FP16 rate) multiply them.
//
// A block computes 128 outputs x 64 activation rows, K in stages of 64. Per stage:
// - the weight tile is decoded to int8 codes and, per run (the 16 or 32 codes that share one
//   scale in the format: Mmq<Dec>::kRun), its float scale s_w and min m_w, so w = s_w * q - m_w;
// - the activations are quantized per 32 values to int8: d_x = max|x| / 127,
//   q_x = round(x * (127 / max|x|)), so x ~ d_x * q_x (within d_x / 2);
// - eight warps multiply the codes with mma.sync (m16n8k32 for runs of 32, m16n8k16 for runs of
//   16; four or two m8n8k16 on sm_75) into int32 per run, and add s_w * d_x * dot(q, q_x) - m_w *
//   d_x * sum(q_x) to FP32 accumulators.
// The result differs from the float product only by the activations' rounding (~0.5% normalized
// error on random data), as llama.cpp's int8 products (q8_1 activations) do.
#pragma once

#include <cstdint>

namespace moe::cuda::detail {

constexpr int kMmqO = 128;  // outputs per block
constexpr int kMmqR = 64;   // activation rows per block
constexpr int kMmqK = 64;   // K per stage
constexpr int kMmqThreads = 256;
// Shared rows of codes are 80 bytes (20 words): the fragment loads of a warp (8 rows x 4 words)
// then fall in 32 different banks.
constexpr int kMmqRowWords = kMmqK / 4 + 4;

// ---- int8 codes of a weight unit
// ------------------------------------------------------------------
//
// Mmq<Dec>::unit(row, u, lo, hi, scale, min): unit u's 8 codes as int8 bytes (elements 8u..8u+3 in
// lo, 8u+4..8u+7 in hi, lowest byte first) with w = scale * q - min for each, the same codes and
// factors as Dec::affine. kRun: the codes one scale and min cover, aligned in the row.

// Byte i of the result: the int8 of exact small-integer float q[i] (|q| < 2^22): adding 1.5 * 2^23
// puts q in two's complement in the low bits of the sum's bit pattern.
__device__ __forceinline__ uint32_t pack_codes(const float* q) {
  uint32_t b[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) b[i] = __float_as_uint(q[i] + 12582912.0f);
  return __byte_perm(__byte_perm(b[0], b[1], 0x0040), __byte_perm(b[2], b[3], 0x0040), 0x5410);
}

// Any block decoder, through its affine() (float codes packed back to bytes).
template <class Dec, int kRunCodes>
struct MmqFromAffine {
  static constexpr int kRun = kRunCodes;
  static __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, uint32_t& lo,
                                              uint32_t& hi, float& scale, float& min) {
    float q[8];
    Dec::affine(row, u, q, scale, min);
    lo = pack_codes(q);
    hi = pack_codes(q + 4);
  }
};

template <class Dec>
struct Mmq;  // only the block types below have one
template <>
struct Mmq<dq::Q4_1> : MmqFromAffine<dq::Q4_1, 32> {};
template <>
struct Mmq<dq::Q5_0> : MmqFromAffine<dq::Q5_0, 32> {};
template <>
struct Mmq<dq::Q5_1> : MmqFromAffine<dq::Q5_1, 32> {};
template <>
struct Mmq<dq::IQ4_NL> : MmqFromAffine<dq::IQ4_NL, 32> {};
template <>
struct Mmq<dq::MXFP4> : MmqFromAffine<dq::MXFP4, 32> {};
template <>
struct Mmq<dq::Q2_0> : MmqFromAffine<dq::Q2_0, 32> {};  // one scale per 64
template <>
struct Mmq<dq::Q2_K> : MmqFromAffine<dq::Q2_K, 16> {};
template <>
struct Mmq<dq::Q3_K> : MmqFromAffine<dq::Q3_K, 16> {};
template <>
struct Mmq<dq::IQ4_XS> : MmqFromAffine<dq::IQ4_XS, 32> {};

// The types of the Q4_K_M / Q8_0 / Q4_0 models decode with integer operations only; their scales
// as Dec::affine computes them.

// Q8_0: the codes are the block's bytes.
template <>
struct Mmq<dq::Q8_0> {
  static constexpr int kRun = 32;
  static __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, uint32_t& lo,
                                              uint32_t& hi, float& scale, float& min) {
    int s;
    const uint8_t* b = dq::unit_block<4, 34>(row, u, s);
    scale = dq::ld_f16(b);
    min = 0.0f;
    dq::ld8_a2(b + 2 + 8 * s, lo, hi);
  }
};

// Q4_0: nibble - 8 per byte.
template <>
struct Mmq<dq::Q4_0> {
  static constexpr int kRun = 32;
  static __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, uint32_t& lo,
                                              uint32_t& hi, float& scale, float& min) {
    int s;
    const uint8_t* b = dq::unit_block<4, 18>(row, u, s);
    scale = dq::ld_f16(b);
    min = 0.0f;
    uint32_t l, h;
    dq::ld8_a2(b + 2 + 8 * (s & 1), l, h);
    lo = __vsub4(dq::nibbles(l, s >= 2), 0x08080808u);
    hi = __vsub4(dq::nibbles(h, s >= 2), 0x08080808u);
  }
};

// Q4_K and Q5_K: unsigned codes (0..15, 0..31) with the sub-block's scale and min.
template <>
struct Mmq<dq::Q4_K> {
  static constexpr int kRun = 32;
  static __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, uint32_t& lo,
                                              uint32_t& hi, float& scale, float& min) {
    int s;
    const uint8_t* b = dq::unit_block<32, 144>(row, u, s);
    const int k = s >> 3;
    const bool high = (s & 4) != 0;
    uint32_t sc, mn;
    dq::scale_min_k4(2 * k + (high ? 1 : 0), b + 4, sc, mn);
    scale = dq::ld_f16(b) * dq::small_int_to_float(sc, 0.0f);
    min = dq::ld_f16(b + 2) * dq::small_int_to_float(mn, 0.0f);
    uint32_t l, h;
    dq::ld8_a4(b + 16 + 32 * k + 8 * (s & 3), l, h);
    lo = dq::nibbles(l, high);
    hi = dq::nibbles(h, high);
  }
};

template <>
struct Mmq<dq::Q5_K> {
  static constexpr int kRun = 32;
  static __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, uint32_t& lo,
                                              uint32_t& hi, float& scale, float& min) {
    int s;
    const uint8_t* b = dq::unit_block<32, 176>(row, u, s);
    const int k = s >> 3;
    const bool high = (s & 4) != 0;
    const int l0 = 8 * (s & 3);
    uint32_t sc, mn;
    dq::scale_min_k4(2 * k + (high ? 1 : 0), b + 4, sc, mn);
    scale = dq::ld_f16(b) * dq::small_int_to_float(sc, 0.0f);
    min = dq::ld_f16(b + 2) * dq::small_int_to_float(mn, 0.0f);
    const int hbit = 2 * k + (high ? 1 : 0);
    uint32_t l, h, hl, hh;
    dq::ld8_a4(b + 48 + 32 * k + l0, l, h);
    dq::ld8_a4(b + 16 + l0, hl, hh);
    lo = dq::nibbles(l, high) | (((hl >> hbit) & 0x01010101u) << 4);
    hi = dq::nibbles(h, high) | (((hh >> hbit) & 0x01010101u) << 4);
  }
};

// Q6_K: 6-bit code - 32 per byte; one scale per 16 codes.
template <>
struct Mmq<dq::Q6_K> {
  static constexpr int kRun = 16;
  static __device__ __forceinline__ void unit(const uint8_t* row, int64_t u, uint32_t& lo,
                                              uint32_t& hi, float& scale, float& min) {
    int s;
    const uint8_t* b = dq::unit_block<32, 210>(row, u, s);
    const int n = s >> 4, g = (s >> 2) & 3, l0 = 8 * (s & 3);
    scale = dq::ld_f16(b + 208) * dq::int8_to_float(dq::ld_u8(b + 192 + 8 * n + (l0 >> 4) + 2 * g));
    min = 0.0f;
    uint32_t l, h, hl, hh;
    dq::ld8_a2(b + 64 * n + l0 + 32 * (g & 1), l, h);
    dq::ld8_a2(b + 128 + 32 * n + l0, hl, hh);
    lo = __vsub4(dq::nibbles(l, g >= 2) | (((hl >> (2 * g)) & 0x03030303u) << 4), 0x20202020u);
    hi = __vsub4(dq::nibbles(h, g >= 2) | (((hh >> (2 * g)) & 0x03030303u) << 4), 0x20202020u);
  }
};

// ---- the kernel
// -------------------------------------------------------------------------------------

// One m8n8k16 int8 product, d (row g: columns 2t, 2t + 1) += a (row g, codes 4t..4t+3) * b
// (column g, codes 4t..4t+3): the only int8 mma shape of sm_75 (Turing).
__device__ __forceinline__ void mma_s8_m8n8k16(int& d0, int& d1, uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
               : "+r"(d0), "+r"(d1)
               : "r"(a), "r"(b));
#else
  (void)d0, (void)d1, (void)a, (void)b;
#endif
}

// d += a * b on the int8 tensor cores: a 16 x 32 (rows of a warp's outputs), b 32 x 8 (columns of
// its activation rows), both in the fragment layout of the PTX ISA (9.7.14.5.9): with
// g = lane / 4 and t = lane % 4, a[0] holds row g, codes 4t..4t+3; a[1] row g + 8, the same
// codes; a[2], a[3] codes 16 + 4t.. of rows g, g + 8; b[0] codes 4t.. of column g, b[1] codes
// 16 + 4t..; d[0], d[1] row g, columns 2t, 2t + 1; d[2], d[3] row g + 8. On sm_75 the same
// registers make four m8n8k16 products (rows g and g + 8, codes 0-15 and 16-31).
__device__ __forceinline__ void mma_s8_k32(int* d, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  mma_s8_m8n8k16(d[0], d[1], a[0], b[0]);
  mma_s8_m8n8k16(d[0], d[1], a[2], b[1]);
  mma_s8_m8n8k16(d[2], d[3], a[1], b[0]);
  mma_s8_m8n8k16(d[2], d[3], a[3], b[1]);
#endif
}
// The same over 16 codes: a[0] row g, a[1] row g + 8 (codes 4t..4t+3), b[0] column g.
__device__ __forceinline__ void mma_s8_k16(int* d, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b[0]));
#else
  mma_s8_m8n8k16(d[0], d[1], a[0], b[0]);
  mma_s8_m8n8k16(d[2], d[3], a[1], b[0]);
#endif
}

struct MmqTile {
  uint32_t w[kMmqO][kMmqRowWords];   // weight codes, [output][k]
  uint32_t x[kMmqR][kMmqRowWords];   // activation codes, [row][k]
  float w_scale[kMmqO][kMmqK / 16];  // per run, at the run's first 16-code slot
  float w_min[kMmqO][kMmqK / 16];
  float x_d[kMmqR][kMmqK / 32];  // per 32 activations
  int x_sum[kMmqR][kMmqK / 16];  // sum of the codes per 16
};

// Quantizes this thread's 16 activations (of 32 shared with the neighbouring lane) into the tile:
// row rl, codes 16 * part .. + 15 of the stage. xr: the activation row (null: a row past the
// group), k0: the stage's first column.
__device__ __forceinline__ void mmq_quantize_x(const Args& a, MmqTile& t, const float* xr,
                                               int64_t k0, int rl, int part) {
  const int64_t kb = k0 + 16 * part;
  float v[16];
  // n_in is a multiple of 32 for every block type: a 16-value part is whole or absent.
  if (xr && kb < a.n_in) {
    if (a.x_vec4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 f = __ldg(reinterpret_cast<const float4*>(xr + kb) + i);
        v[4 * i] = f.x;
        v[4 * i + 1] = f.y;
        v[4 * i + 2] = f.z;
        v[4 * i + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = __ldg(xr + kb + i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = 0.0f;
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));  // the other half of the 32
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  int sum = 0;
  uint32_t words[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t packed = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = __float2int_rn(v[4 * w + i] * inv);
      sum += q;
      packed |= (static_cast<uint32_t>(q) & 0xFFu) << (8 * i);
    }
    words[w] = packed;
  }
  *reinterpret_cast<uint4*>(&t.x[rl][4 * part]) =
      make_uint4(words[0], words[1], words[2], words[3]);
  t.x_sum[rl][part] = sum;
  if ((part & 1) == 0) t.x_d[rl][part / 2] = amax / 127.0f;
}

// Grid: x = output tiles, y = group, z = row tiles (a block strides over further row tiles). Two
// blocks per SM (at most 128 registers a thread) so one block's decode overlaps the other's mma.
template <class Dec>
__global__ void __launch_bounds__(kMmqThreads, 2) gemm_mmq_kernel(Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  using M = Mmq<Dec>;
  static_assert(M::kRun == 16 || M::kRun == 32);
  __shared__ __align__(16) MmqTile t;
  int64_t r0, r1;
  const uint8_t* w = group_range(a, static_cast<int>(blockIdx.y), r0, r1);
  const int64_t count = r1 - r0;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kMmqO;
  if (!w) {
    if (blockIdx.z == 0) fill_nan(a, r0, r1, o0, kMmqO);
    return;
  }
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, tg = lane % 4;
  // Warp w owns outputs 32 * (w % 4) .. +31 and activation rows 32 * (w / 4) .. +31 of the tile.
  const int wo = 32 * (warp % 4), wr = 32 * (warp / 4);
  constexpr int kUnitsPerRow = kMmqK / 8;
  constexpr int kDecodes = kMmqO * kUnitsPerRow / kMmqThreads;  // weight units per thread
  static_assert(kDecodes * kMmqThreads == kMmqO * kUnitsPerRow);
  static_assert(kMmqR * 4 == kMmqThreads);  // four threads quantize a row's 64 activations
  const int xrl = tid / 4, xpart = tid % 4;
  for (int64_t rt = static_cast<int64_t>(blockIdx.z) * kMmqR; rt < count;
       rt += static_cast<int64_t>(gridDim.z) * kMmqR) {
    const float* xr = rt + xrl < count ? x_row(a, r0 + rt + xrl) : nullptr;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][n][e] = 0.0f;
      }
    }
    for (int64_t k0 = 0; k0 < a.n_in; k0 += kMmqK) {
      // The weight units' loads all in flight, the activations quantized, then the units' stores.
      uint32_t lo[kDecodes], hi[kDecodes];
      float sc[kDecodes], mn[kDecodes];
#pragma unroll
      for (int it = 0; it < kDecodes; ++it) {
        const int u = tid + it * kMmqThreads;
        const int64_t o = o0 + u / kUnitsPerRow;
        const int64_t k = k0 + static_cast<int64_t>(u % kUnitsPerRow) * 8;
        lo[it] = hi[it] = 0u;
        sc[it] = mn[it] = 0.0f;
        if (o < a.n_out && k < a.n_in) {
          M::unit(w + o * static_cast<int64_t>(a.row_bytes), k / 8, lo[it], hi[it], sc[it], mn[it]);
        }
      }
      mmq_quantize_x(a, t, xr, k0, xrl, xpart);
#pragma unroll
      for (int it = 0; it < kDecodes; ++it) {
        const int u = tid + it * kMmqThreads;
        const int ol = u / kUnitsPerRow, ku = u % kUnitsPerRow;
        *reinterpret_cast<uint2*>(&t.w[ol][2 * ku]) = make_uint2(lo[it], hi[it]);
        if ((8 * ku) % M::kRun == 0) {
          t.w_scale[ol][ku / 2] = sc[it];
          t.w_min[ol][ku / 2] = mn[it];
        }
      }
      __syncthreads();
      // Not unrolled: the runs' scale loads would all be hoisted and spill.
#pragma unroll 1
      for (int s16 = 0; s16 < kMmqK / 16; s16 += M::kRun / 16) {
        const int kw = 4 * s16;  // the run's first word in a row
        // This thread's activation rows (2t, 2t + 1 of each 8-row tile): d_x and d_x * sum(q_x).
        float dx[4][2], dsx[4][2];
#pragma unroll
        for (int n = 0; n < 4; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int rl = wr + 8 * n + 2 * tg + e;
            const int sum =
                M::kRun == 32 ? t.x_sum[rl][s16] + t.x_sum[rl][s16 + 1] : t.x_sum[rl][s16];
            dx[n][e] = t.x_d[rl][s16 / 2];
            dsx[n][e] = dx[n][e] * static_cast<float>(sum);
          }
        }
        uint32_t bf[4][2];
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const int rl = wr + 8 * n + g;
          bf[n][0] = t.x[rl][kw + tg];
          bf[n][1] = t.x[rl][kw + 4 + tg];
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int ol = wo + 16 * i + g;
          uint32_t af[4];
          af[0] = t.w[ol][kw + tg];
          af[1] = t.w[ol + 8][kw + tg];
          af[2] = t.w[ol][kw + 4 + tg];
          af[3] = t.w[ol + 8][kw + 4 + tg];
          const float sw[2] = {t.w_scale[ol][s16], t.w_scale[ol + 8][s16]};
          const float mw[2] = {t.w_min[ol][s16], t.w_min[ol + 8][s16]};
#pragma unroll
          for (int n = 0; n < 4; ++n) {
            int c[4] = {0, 0, 0, 0};
            if constexpr (M::kRun == 32) {
              mma_s8_k32(c, af, bf[n]);
            } else {
              const uint32_t a16[2] = {af[0], af[1]};
              mma_s8_k16(c, a16, bf[n]);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int h = e / 2, col = e % 2;  // output g + 8h, activation row 2t + col
              acc[i][n][e] += static_cast<float>(c[e]) * (sw[h] * dx[n][col]) - mw[h] * dsx[n][col];
            }
          }
        }
      }
      __syncthreads();  // the tile is rewritten by the next stage
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t o = o0 + wo + 16 * i + g + 8 * (e / 2);
          const int64_t jl = rt + wr + 8 * n + 2 * tg + e % 2;
          if (jl < count && o < a.n_out) a.y[(r0 + jl) * a.n_out + o] = acc[i][n][e];
        }
      }
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // launched only on sm_75+ (int8_products_enabled()): fail loudly rather than leave y
#else
  (void)a;
#endif
}

}  // namespace moe::cuda::detail
