// The KV cache's row formats on the device, shared by the stores and attention (attention.cu) and
// the context shift (kv_shift.cu): each type's encoder, byte-identical to cpu::encode_kv_row, and
// its decoder, bit-identical to cpu::dequantize_row. Only .cu files include this.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "common/error.h"
#include "common/ggml_type.h"
#include "kernels/cuda/dequant_device.cuh"
#include "kernels/cuda/launch_util.cuh"

namespace moe::cuda {

enum KvCode : int {
  kKvF32 = 0,
  kKvF16 = 1,
  kKvQ8_0 = 2,
  kKvQ4_0 = 3,
  kKvBF16 = 4,
  kKvQ4_1 = 5,
  kKvQ5_0 = 6,
  kKvQ5_1 = 7,
  kKvIQ4_NL = 8
};

// One side (K or V) of a store: n_tokens source rows of `elems` floats, row t at src + t * stride.
struct KvStoreSide {
  uint8_t* base;
  size_t row_bytes;
  int code;
  int64_t elems;
  const float* src;
  int64_t stride;
  int64_t ring;  // DeviceKvLayer::ring (0: a row per position)
};

// The cache row of position pos: a sliding-window layer's ring (DeviceKvLayer::ring rows) keeps
// position p in row p % ring, as the host cache does.
__device__ __forceinline__ int64_t kv_row(int64_t pos, int64_t ring) {
  return ring > 0 ? pos % ring : pos;
}

// F32 / F16 rows: one thread per element.
__device__ __forceinline__ void kv_store_plain(const KvStoreSide& s, int64_t n_tokens,
                                               int64_t pos0) {
  for (int64_t i = grid_index(); i < n_tokens * s.elems; i += grid_stride()) {
    const int64_t t = i / s.elems, e = i % s.elems;
    uint8_t* row = s.base + kv_row(pos0 + t, s.ring) * static_cast<int64_t>(s.row_bytes);
    const float x = s.src[t * s.stride + e];
    if (s.code == kKvF32) {
      reinterpret_cast<float*>(row)[e] = x;
    } else if (s.code == kKvBF16) {
      reinterpret_cast<__nv_bfloat16*>(row)[e] = __float2bfloat16_rn(x);
    } else {
      reinterpret_cast<__half*>(row)[e] = __float2half_rn(x);
    }
  }
}

// Q8_0 rows: one warp per block of 32, as quantize_row_q8_0_ref (d = amax / 127, q = roundf(x *
// (1/d))), so the bytes equal the CPU cache's.
__device__ __forceinline__ void kv_store_q8_0(const KvStoreSide& s, int64_t n_tokens,
                                              int64_t pos0) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t blocks_per_row = s.elems / 32;
  const int64_t n_blocks = n_tokens * blocks_per_row;
  for (int64_t wb = grid_index() / 32; wb < n_blocks; wb += grid_stride() / 32) {
    const int64_t t = wb / blocks_per_row, b = wb % blocks_per_row;
    const float x = s.src[t * s.stride + b * 32 + lane];
    float amax = fabsf(x);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, m));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* blk = s.base + kv_row(pos0 + t, s.ring) * static_cast<int64_t>(s.row_bytes) + b * 34;
    blk[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(roundf(x * id)));
    if (lane == 0) *reinterpret_cast<__half*>(blk) = __float2half_rn(d);
  }
}

// The value of largest magnitude across the warp, with its sign; the lowest lane wins a tie, as
// the reference quantizers' loops keep the first one they meet.
__device__ __forceinline__ float warp_signed_absmax(float x, int lane) {
  float best = x, best_abs = fabsf(x);
  int best_lane = lane;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    const float o = __shfl_xor_sync(0xFFFFFFFFu, best, m);
    const float oa = __shfl_xor_sync(0xFFFFFFFFu, best_abs, m);
    const int ol = __shfl_xor_sync(0xFFFFFFFFu, best_lane, m);
    if (oa > best_abs || (oa == best_abs && ol < best_lane)) {
      best = o;
      best_abs = oa;
      best_lane = ol;
    }
  }
  return best;
}

// Q4_0 rows: one warp per block of 32, as quantize_row_q4_0_ref: the signed value of largest
// magnitude (the first one in index order on ties, as its loop) maps to -8, d = max / -8, q =
// min(15, (int)(x / d + 8.5)); lane j < 16 packs q[j] | q[j + 16] << 4. Byte-identical to the CPU.
__device__ __forceinline__ void kv_store_q4_0(const KvStoreSide& s, int64_t n_tokens,
                                              int64_t pos0) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t blocks_per_row = s.elems / 32;
  const int64_t n_blocks = n_tokens * blocks_per_row;
  for (int64_t wb = grid_index() / 32; wb < n_blocks; wb += grid_stride() / 32) {
    const int64_t t = wb / blocks_per_row, b = wb % blocks_per_row;
    const float x = s.src[t * s.stride + b * 32 + lane];
    const float best = warp_signed_absmax(x, lane);
    const float d = best / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    // Rounded multiply, then add (no fused multiply-add), as the CPU computes it.
    const int q = min(15, static_cast<int>(__fadd_rn(__fmul_rn(x, id), 8.5f)));
    const int hi = __shfl_down_sync(0xFFFFFFFFu, q, 16);
    uint8_t* blk = s.base + kv_row(pos0 + t, s.ring) * static_cast<int64_t>(s.row_bytes) + b * 18;
    if (lane < 16) blk[2 + lane] = static_cast<uint8_t>(q | (hi << 4));
    if (lane == 0) *reinterpret_cast<__half*>(blk) = __float2half_rn(d);
  }
}

// Q4_1 / Q5_1 / Q5_0 rows: one warp per block of 32, as their reference quantizers (kv_quant.cpp):
// min/max (or the signed largest value for Q5_0) over the warp, d and the offset, q rounded half
// up with separately rounded operations; lane j < 16 packs the low nibbles of q[j] and q[j + 16],
// and the fifth bits (Q5) of all 32 lanes form qh through a ballot. Byte-identical to the CPU.
template <int kCode>
__device__ __forceinline__ void kv_store_q4q5(const KvStoreSide& s, int64_t n_tokens,
                                              int64_t pos0) {
  constexpr bool kAffine = kCode != kKvQ5_0;
  constexpr int kBlock = kCode == kKvQ4_1 ? 20 : kCode == kKvQ5_0 ? 22 : 24;
  constexpr int kQs = kCode == kKvQ4_1 ? 4 : kCode == kKvQ5_0 ? 6 : 8;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t blocks_per_row = s.elems / 32;
  const int64_t n_blocks = n_tokens * blocks_per_row;
  for (int64_t wb = grid_index() / 32; wb < n_blocks; wb += grid_stride() / 32) {
    const int64_t t = wb / blocks_per_row, b = wb % blocks_per_row;
    const float x = s.src[t * s.stride + b * 32 + lane];
    uint8_t* blk =
        s.base + kv_row(pos0 + t, s.ring) * static_cast<int64_t>(s.row_bytes) + b * kBlock;
    int q;
    if constexpr (kAffine) {
      float mn = x, mx = x;
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) {
        mn = fminf(mn, __shfl_xor_sync(0xFFFFFFFFu, mn, m));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, m));
      }
      const float d = __fdiv_rn(__fsub_rn(mx, mn), kCode == kKvQ4_1 ? 15.0f : 31.0f);
      const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
      q = static_cast<int>(__fadd_rn(__fmul_rn(__fsub_rn(x, mn), id), 0.5f));
      if (kCode == kKvQ4_1) q = min(15, q);
      if (lane == 0) {
        *reinterpret_cast<__half*>(blk) = __float2half_rn(d);
        *reinterpret_cast<__half*>(blk + 2) = __float2half_rn(mn);
      }
    } else {
      const float best = warp_signed_absmax(x, lane);
      const float d = __fdiv_rn(best, -16.0f);
      const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
      q = min(31, static_cast<int>(__fadd_rn(__fmul_rn(x, id), 16.5f)));
      if (lane == 0) *reinterpret_cast<__half*>(blk) = __float2half_rn(d);
    }
    const int hi = __shfl_down_sync(0xFFFFFFFFu, q, 16);
    const unsigned qh = __ballot_sync(0xFFFFFFFFu, (q >> 4) & 1);
    if (lane < 16) blk[kQs + lane] = static_cast<uint8_t>((q & 15) | ((hi & 15) << 4));
    if (kCode != kKvQ4_1 && lane < 4) {
      const int at = kCode == kKvQ5_0 ? 2 : 4;
      blk[at + lane] = static_cast<uint8_t>(qh >> (8 * lane));
    }
  }
}

// The index of the IQ4_NL table value nearest v: the count of midpoints of neighbours (exact in
// float) below v, so v on a midpoint takes the lower index, as the CPU's iq4_nl_index.
__device__ __forceinline__ int iq4nl_index(float v) {
  int q = 0;
#pragma unroll
  for (int k = 0; k < 15; ++k) {
    q += v > 0.5f * (dq::iq4nl_value(k) + dq::iq4nl_value(k + 1)) ? 1 : 0;
  }
  return q;
}

// IQ4_NL rows: one warp per block of 32, by the CPU's rule (kv_quant.cpp): d = max / -127 with
// max the signed value of largest magnitude, q the nearest table value to x / d; d refined once
// by least squares, sum(t[q] x) / sum(t[q]^2) (products exact in double, summed by the xor
// butterfly the CPU replays), rounded to f16, and q picked again against it. Byte-identical to
// the CPU.
__device__ __forceinline__ void kv_store_iq4_nl(const KvStoreSide& s, int64_t n_tokens,
                                                int64_t pos0) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t blocks_per_row = s.elems / 32;
  const int64_t n_blocks = n_tokens * blocks_per_row;
  for (int64_t wb = grid_index() / 32; wb < n_blocks; wb += grid_stride() / 32) {
    const int64_t t = wb / blocks_per_row, b = wb % blocks_per_row;
    const float x = s.src[t * s.stride + b * 32 + lane];
    const float best = warp_signed_absmax(x, lane);
    const float d0 = __fdiv_rn(best, -127.0f);
    const float id0 = d0 != 0.0f ? __fdiv_rn(1.0f, d0) : 0.0f;
    int q = iq4nl_index(__fmul_rn(x, id0));
    const float tq = dq::iq4nl_value(static_cast<uint32_t>(q));
    double sumqx = __dmul_rn(static_cast<double>(tq), static_cast<double>(x));
    float sumq2 = __fmul_rn(tq, tq);  // integers below 2^24: exact in any order
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
      sumqx = __dadd_rn(sumqx, __shfl_xor_sync(0xFFFFFFFFu, sumqx, m));
      sumq2 = __fadd_rn(sumq2, __shfl_xor_sync(0xFFFFFFFFu, sumq2, m));
    }
    const float d1 =
        d0 != 0.0f ? __double2float_rn(__ddiv_rn(sumqx, static_cast<double>(sumq2))) : 0.0f;
    const __half dh = __float2half_rn(d1);
    const float d = __half2float(dh);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    q = iq4nl_index(__fmul_rn(x, id));
    const int hi = __shfl_down_sync(0xFFFFFFFFu, q, 16);
    uint8_t* blk = s.base + kv_row(pos0 + t, s.ring) * static_cast<int64_t>(s.row_bytes) + b * 18;
    if (lane < 16) blk[2 + lane] = static_cast<uint8_t>(q | (hi << 4));
    if (lane == 0) *reinterpret_cast<__half*>(blk) = dh;
  }
}

// Stores n_tokens rows of one side at positions pos0.. with the encoder of its type; every
// thread of a 1-D grid (of whole warps) takes part.
__device__ __forceinline__ void kv_store_rows(const KvStoreSide& s, int64_t n_tokens,
                                              int64_t pos0) {
  if (s.code == kKvQ8_0) {
    kv_store_q8_0(s, n_tokens, pos0);
  } else if (s.code == kKvQ4_0) {
    kv_store_q4_0(s, n_tokens, pos0);
  } else if (s.code == kKvQ4_1) {
    kv_store_q4q5<kKvQ4_1>(s, n_tokens, pos0);
  } else if (s.code == kKvQ5_0) {
    kv_store_q4q5<kKvQ5_0>(s, n_tokens, pos0);
  } else if (s.code == kKvQ5_1) {
    kv_store_q4q5<kKvQ5_1>(s, n_tokens, pos0);
  } else if (s.code == kKvIQ4_NL) {
    kv_store_iq4_nl(s, n_tokens, pos0);
  } else {
    kv_store_plain(s, n_tokens, pos0);
  }
}

// Element idx of a cache row, decoded exactly as the CPU's dequantize_row.
template <int kCode>
__device__ __forceinline__ float kv_value(const uint8_t* row, int64_t idx) {
  if constexpr (kCode == kKvF32) {
    return reinterpret_cast<const float*>(row)[idx];
  } else if constexpr (kCode == kKvF16) {
    return dq::ld_f16(row + 2 * idx);
  } else if constexpr (kCode == kKvQ8_0) {
    const uint8_t* b = row + (idx / 32) * 34;
    return dq::int8_to_float(dq::ld_u8(b + 2 + idx % 32)) * dq::ld_f16(b);
  } else if constexpr (kCode == kKvQ4_0) {
    const uint8_t* b = row + (idx / 32) * 18;
    const int j = static_cast<int>(idx % 32);
    const int byte = dq::ld_u8(b + 2 + (j & 15));
    return static_cast<float>(((j < 16 ? byte : byte >> 4) & 15) - 8) * dq::ld_f16(b);
  } else if constexpr (kCode == kKvBF16) {
    return __uint_as_float(dq::ld_u16(row + 2 * idx) << 16);
  } else if constexpr (kCode == kKvIQ4_NL) {
    const uint8_t* b = row + (idx / 32) * 18;
    const int j = static_cast<int>(idx % 32);
    const uint32_t byte = dq::ld_u8(b + 2 + (j & 15));
    return dq::ld_f16(b) * dq::iq4nl_value(j < 16 ? byte : byte >> 4);
  } else {
    // Q4_1, Q5_0, Q5_1: the low nibble, the fifth bit from qh, then d, and m where affine.
    constexpr int kBlock = kCode == kKvQ4_1 ? 20 : kCode == kKvQ5_0 ? 22 : 24;
    constexpr int kQs = kCode == kKvQ4_1 ? 4 : kCode == kKvQ5_0 ? 6 : 8;
    const uint8_t* b = row + (idx / 32) * kBlock;
    const int j = static_cast<int>(idx % 32);
    const int byte = dq::ld_u8(b + kQs + (j & 15));
    int q = (j < 16 ? byte : byte >> 4) & 15;
    if constexpr (kCode != kKvQ4_1) {
      const int at = kCode == kKvQ5_0 ? 2 : 4;
      q |= static_cast<int>((dq::ld_u8(b + at + j / 8) >> (j % 8)) & 1) << 4;
    }
    if constexpr (kCode == kKvQ5_0) return static_cast<float>(q - 16) * dq::ld_f16(b);
    return static_cast<float>(q) * dq::ld_f16(b) + dq::ld_f16(b + 2);
  }
}

// Values [idx0, idx0 + 8) of a cache row (idx0 % 8 == 0, so they lie in one block of 32),
// bit-identical to kv_value at each index: the block's scales and fifth bits are read once
// instead of once per value, which is what a tile loader decoding a quantized cache spends most
// of its instructions on.
template <int kCode>
__device__ __forceinline__ void kv_run8(const uint8_t* row, int64_t idx0, float (&x)[8]) {
  if constexpr (kCode == kKvF32 || kCode == kKvF16 || kCode == kKvBF16) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = kv_value<kCode>(row, idx0 + i);
  } else if constexpr (kCode == kKvQ8_0) {
    const uint8_t* b = row + (idx0 / 32) * 34;
    const uint8_t* qs = b + 2 + idx0 % 32;
    const float d = dq::ld_f16(b);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = dq::int8_to_float(dq::ld_u8(qs + i)) * d;
  } else {
    constexpr int kBlock = kCode == kKvQ4_1   ? 20
                           : kCode == kKvQ5_0 ? 22
                           : kCode == kKvQ5_1 ? 24
                                              : 18;
    constexpr int kQs = kCode == kKvQ4_1 ? 4 : kCode == kKvQ5_0 ? 6 : kCode == kKvQ5_1 ? 8 : 2;
    const uint8_t* b = row + (idx0 / 32) * kBlock;
    const int j0 = static_cast<int>(idx0 % 32);
    const int shift = j0 < 16 ? 0 : 4;  // the 8 values share a nibble half
    const uint8_t* qs = b + kQs + (j0 & 15);
    const float d = dq::ld_f16(b);
    uint32_t hb = 0;  // the fifth bits of the 8 values (Q5_x): one byte of qh
    if constexpr (kCode == kKvQ5_0 || kCode == kKvQ5_1) {
      hb = dq::ld_u8(b + (kCode == kKvQ5_0 ? 2 : 4) + j0 / 8);
    }
    float m = 0.0f;
    if constexpr (kCode == kKvQ4_1 || kCode == kKvQ5_1) m = dq::ld_f16(b + 2);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int nib = static_cast<int>((dq::ld_u8(qs + i) >> shift) & 15);
      if constexpr (kCode == kKvQ4_0) {
        x[i] = static_cast<float>(nib - 8) * d;
      } else if constexpr (kCode == kKvIQ4_NL) {
        x[i] = d * dq::iq4nl_value(static_cast<uint32_t>(nib));
      } else if constexpr (kCode == kKvQ4_1) {
        x[i] = static_cast<float>(nib) * d + m;
      } else {
        const int q = nib | static_cast<int>((hb >> i) & 1) << 4;
        if constexpr (kCode == kKvQ5_0) {
          x[i] = static_cast<float>(q - 16) * d;
        } else {
          x[i] = static_cast<float>(q) * d + m;
        }
      }
    }
  }
}

// kv_value for a type known only at run time.
__device__ __forceinline__ float kv_value_of(int code, const uint8_t* row, int64_t idx) {
  switch (code) {
    case kKvF32:
      return kv_value<kKvF32>(row, idx);
    case kKvF16:
      return kv_value<kKvF16>(row, idx);
    case kKvQ8_0:
      return kv_value<kKvQ8_0>(row, idx);
    case kKvQ4_0:
      return kv_value<kKvQ4_0>(row, idx);
    case kKvBF16:
      return kv_value<kKvBF16>(row, idx);
    case kKvQ4_1:
      return kv_value<kKvQ4_1>(row, idx);
    case kKvQ5_0:
      return kv_value<kKvQ5_0>(row, idx);
    case kKvIQ4_NL:
      return kv_value<kKvIQ4_NL>(row, idx);
    default:
      return kv_value<kKvQ5_1>(row, idx);
  }
}

// The code of a cache type; moe::Error naming `what` for a type the GPU does not store.
inline int kv_code(GgmlType t, const char* what) {
  switch (t) {
    case GgmlType::F32:
      return kKvF32;
    case GgmlType::F16:
      return kKvF16;
    case GgmlType::Q8_0:
      return kKvQ8_0;
    case GgmlType::Q4_0:
      return kKvQ4_0;
    case GgmlType::BF16:
      return kKvBF16;
    case GgmlType::Q4_1:
      return kKvQ4_1;
    case GgmlType::Q5_0:
      return kKvQ5_0;
    case GgmlType::Q5_1:
      return kKvQ5_1;
    case GgmlType::IQ4_NL:
      return kKvIQ4_NL;
    default:
      throw Error(
          std::string(what) + ": KV cache type " + ggml_type_label(static_cast<uint32_t>(t)) +
          " is not supported on the GPU (f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1, iq4_nl)");
  }
}

}  // namespace moe::cuda
