// The decode-step attention kernel (attention_decode.cuh). A block owns one KV head and one slice
// of the cache positions; its 4 warps take every 4th position of the slice. Lane l holds head
// dims [l * DPL, l * DPL + DPL) of the K and V rows (the rows of the positions two ahead are in
// flight while one is computed) and of every query row. Each position's NQ partial dot products
// are summed across the warp by a transposed butterfly (NQ - 1 + 5 - log2 NQ shuffles instead of
// 5 NQ), which leaves each lane the score of query lane >> (5 - log2 NQ); that lane's online
// softmax step is broadcast to all lanes for the p·v update. The warps' (m, l, acc) are combined
// through shared memory at the end, into the output or into the partials of attention.cu's merge.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant_device.cuh"
#include "kernels/cuda/kv_rows.cuh"

namespace moe::cuda {
namespace {

constexpr int kDecodeWarps = 4;

// The other types, and runs cut by the head's end, element by element through an out-of-line
// decoder: inlined, their decoders crowd the registers of the common types' loop, and an
// out-of-line call taking the row array would move the arrays to local memory.
__device__ __noinline__ float kv_value_any(int code, const uint8_t* row, int64_t idx) {
  return kv_value_of(code, row, idx);
}

// Values [e, e + DPL) of a cache row, decoded bit-identically to kv_value (e % DPL == 0 and DPL
// divides 32, so they lie in one quantization block); zeros from element `hd` of the head on.
template <int DPL>
__device__ __forceinline__ void load_run(int code, const uint8_t* row, int64_t e, int n_valid,
                                         float (&x)[DPL]) {
  if (n_valid >= DPL && code == kKvF16 &&
      reinterpret_cast<uintptr_t>(row + 2 * e) % (2 * DPL) == 0) {
    const uint8_t* p = row + 2 * e;
    if constexpr (DPL == 8) {
      const uint4 u = *reinterpret_cast<const uint4*>(p);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        x[2 * i] = f.x;
        x[2 * i + 1] = f.y;
      }
    } else if constexpr (DPL == 4) {
      const uint2 u = *reinterpret_cast<const uint2*>(p);
      const uint32_t w[2] = {u.x, u.y};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        x[2 * i] = f.x;
        x[2 * i + 1] = f.y;
      }
    } else {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
      x[0] = f.x;
      x[1] = f.y;
    }
    return;
  }
  if (n_valid >= DPL && code == kKvQ4_0) {
    const uint8_t* b = row + (e / 32) * 18;
    const int j0 = static_cast<int>(e % 32);
    const float d = dq::ld_f16(b);
    const uint8_t* qs = b + 2 + (j0 & 15);
    const int shift = j0 < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      x[i] = static_cast<float>(static_cast<int>((dq::ld_u8(qs + i) >> shift) & 15) - 8) * d;
    }
    return;
  }
  if (n_valid >= DPL && code == kKvQ8_0) {
    const uint8_t* b = row + (e / 32) * 34;
    const float d = dq::ld_f16(b);
    const uint8_t* qs = b + 2 + e % 32;
#pragma unroll
    for (int i = 0; i < DPL; ++i) x[i] = dq::int8_to_float(dq::ld_u8(qs + i)) * d;
    return;
  }
#pragma unroll
  for (int i = 0; i < DPL; ++i) x[i] = i < n_valid ? kv_value_any(code, row, e + i) : 0.0f;
}

template <int NQ>
constexpr int log2_rows() {
  return NQ >= 8 ? 3 : NQ >= 4 ? 2 : NQ >= 2 ? 1 : 0;
}

// Sums v[g] over the warp for every g; returns the sum of v[lane >> (5 - log2 NQ)]. Each halving
// step keeps the half of the rows selected by the lane's bit and adds the partner's copy of it.
template <int NQ>
__device__ __forceinline__ float transposed_warp_sum(float (&v)[NQ], int lane) {
#pragma unroll
  for (int half = NQ / 2, mask = 16; half >= 1; half /= 2, mask /= 2) {
    const bool upper = (lane & mask) != 0;
#pragma unroll
    for (int j = 0; j < half; ++j) {
      const float keep = upper ? v[j + half] : v[j];
      const float give = upper ? v[j] : v[j + half];
      v[j] = keep + __shfl_xor_sync(0xFFFFFFFFu, give, mask);
    }
  }
  float s = v[0];
#pragma unroll
  for (int mask = 16 >> log2_rows<NQ>(); mask >= 1; mask /= 2) {
    s += __shfl_xor_sync(0xFFFFFFFFu, s, mask);
  }
  return s;
}

template <int DPL, int NQ>
__global__ void __launch_bounds__(kDecodeWarps * 32) attention_decode_kernel(AttnArgs a) {
  constexpr int kShift = 5 - log2_rows<NQ>();  // lanes per query row after the reduction
  __shared__ float s_acc[kDecodeWarps][NQ][32 * DPL];
  __shared__ float s_m[kDecodeWarps][NQ], s_l[kDecodeWarps][NQ];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int hk = static_cast<int>(blockIdx.y);
  const int n_q = static_cast<int>(a.n_tokens) * a.group;  // <= NQ (attention_decode_serves)
  // A refused device position reads nothing past the batch's own rows (as attention.cu).
  const int64_t pos0 = batch_pos0(a.device_pos0, a.pos0, a.n_tokens, a.n_ctx);
  const int64_t split_len = split_length(pos0 + a.n_tokens, a.split_bound);
  const int64_t p_begin = static_cast<int64_t>(blockIdx.z) * split_len;
  const int64_t p_end = std::min(p_begin + split_len, pos0 + a.n_tokens);
  if (p_begin >= p_end && gridDim.z > 1) {
    // An empty slice (most of a graph's fixed grid at a short context): the merge reads only its
    // (m, l), and only to see that it is empty.
    for (int g = static_cast<int>(threadIdx.x); g < n_q; g += kDecodeWarps * 32) {
      const int64_t qidx = (g / a.group) * a.n_head + hk * a.group + g % a.group;
      const int64_t pi = static_cast<int64_t>(blockIdx.z) * a.n_tokens * a.n_head + qidx;
      a.part_ml[2 * pi] = -INFINITY;
      a.part_ml[2 * pi + 1] = 0.0f;
    }
    return;
  }
  const int d0 = lane * DPL;
  const int64_t k_off = static_cast<int64_t>(hk) * a.hd_k + d0;
  const int64_t v_off = static_cast<int64_t>(hk) * a.hd_v + d0;
  const int k_valid = a.hd_k - d0, v_valid = a.hd_v - d0;

  float q[NQ][DPL];
#pragma unroll
  for (int g = 0; g < NQ; ++g) {
    const int64_t t = g / a.group;
    const int h = hk * a.group + g % a.group;
    const float* qr = a.q + t * a.q_stride + static_cast<int64_t>(h) * a.hd_k + d0;
#pragma unroll
    for (int i = 0; i < DPL; ++i) q[g][i] = g < n_q && i < k_valid ? qr[i] : 0.0f;
  }
  const int own = lane >> kShift;  // the query row this lane scores
  const int64_t own_vis = own < n_q ? pos0 + own / a.group + 1 : 0;  // causal: [0, pos0 + t]
  float m = -INFINITY, l = 0.0f;
  float acc[NQ][DPL];
#pragma unroll
  for (int g = 0; g < NQ; ++g) {
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[g][i] = 0.0f;
  }

  // Rows two positions ahead are in flight while one is computed (the loop is latency-bound).
  // Three buffers taken in turn by a loop unrolled three times: rotating two buffers by copies
  // made each copy wait for the load just issued, which left nothing in flight.
  const auto load = [&](int64_t pos, float(&kr)[DPL], float(&vr)[DPL]) {
    if (pos < p_end) {
      load_run<DPL>(a.k_code, a.k + pos * static_cast<int64_t>(a.k_row_bytes), k_off, k_valid, kr);
      load_run<DPL>(a.v_code, a.v + pos * static_cast<int64_t>(a.v_row_bytes), v_off, v_valid, vr);
    }
  };
  const auto step = [&](int64_t pos, const float(&kr)[DPL], const float(&vr)[DPL]) {
    float s[NQ];
#pragma unroll
    for (int g = 0; g < NQ; ++g) {
      float s0 = 0.0f, s1 = 0.0f;  // two chains halve the FMA latency
#pragma unroll
      for (int i = 0; i < DPL; i += 2) {
        s0 = fmaf(q[g][i], kr[i], s0);
        s1 = fmaf(q[g][i + 1], kr[i + 1], s1);
      }
      s[g] = s0 + s1;
    }
    float sc = transposed_warp_sum<NQ>(s, lane);
    sc = pos < own_vis ? sc * a.scale : -INFINITY;
    const float m_new = fmaxf(m, sc);
    // Nothing visible yet for this row: leave it untouched (corr 1, p 0).
    const float corr = m_new == -INFINITY ? 1.0f : expf(m - m_new);
    const float pr = m_new == -INFINITY ? 0.0f : expf(sc - m_new);
    l = l * corr + pr;
    m = m_new;
    // After the first positions a row's max rarely moves: skip the rescale when no row's did
    // (a multiply by 1 is exact, so the result is the same).
    if (__any_sync(0xFFFFFFFFu, corr != 1.0f)) {
#pragma unroll
      for (int g = 0; g < NQ; ++g) {
        const float cg = __shfl_sync(0xFFFFFFFFu, corr, g << kShift);
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[g][i] *= cg;
      }
    }
#pragma unroll
    for (int g = 0; g < NQ; ++g) {
      const float pg = __shfl_sync(0xFFFFFFFFu, pr, g << kShift);
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[g][i] = fmaf(pg, vr[i], acc[g][i]);
    }
  };
  constexpr int W = kDecodeWarps;
  float k0[DPL], v0[DPL], k1[DPL], v1[DPL], k2[DPL], v2[DPL];
  int64_t p = p_begin + warp;
  load(p, k0, v0);
  load(p + W, k1, v1);
  for (; p < p_end; p += 3 * W) {
    load(p + 2 * W, k2, v2);
    step(p, k0, v0);
    if (p + W >= p_end) break;
    load(p + 3 * W, k0, v0);
    step(p + W, k1, v1);
    if (p + 2 * W >= p_end) break;
    load(p + 4 * W, k1, v1);
    step(p + 2 * W, k2, v2);
  }

  // The warps' states, combined per query row: out = sum_w acc_w e^(m_w - M) / sum_w l_w e^(...).
#pragma unroll
  for (int g = 0; g < NQ; ++g) {
#pragma unroll
    for (int i = 0; i < DPL; ++i) s_acc[warp][g][d0 + i] = acc[g][i];
  }
  if ((lane & ((1 << kShift) - 1)) == 0) {
    s_m[warp][own] = m;
    s_l[warp][own] = l;
  }
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < n_q * a.hd_v; idx += kDecodeWarps * 32) {
    const int g = idx / a.hd_v, d = idx % a.hd_v;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, s_m[w][g]);
    float lsum = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float f = s_m[w][g] == -INFINITY ? 0.0f : expf(s_m[w][g] - mx);
      lsum = fmaf(s_l[w][g], f, lsum);
      o = fmaf(s_acc[w][g][d], f, o);
    }
    const int64_t t = g / a.group;
    const int h = hk * a.group + g % a.group;
    const int64_t qidx = t * a.n_head + h;
    if (gridDim.z == 1) {
      a.out[qidx * a.hd_v + d] = o / lsum;
      continue;
    }
    const int64_t pi = static_cast<int64_t>(blockIdx.z) * a.n_tokens * a.n_head + qidx;
    a.part_acc[pi * a.hd_v + d] = o;
    if (d == 0) {
      a.part_ml[2 * pi] = mx;
      a.part_ml[2 * pi + 1] = lsum;
    }
  }
}

template <int DPL>
void launch_rows(const AttnArgs& a, int64_t n_head_kv, int n_split, cudaStream_t stream) {
  const dim3 grid(1, static_cast<unsigned>(n_head_kv), static_cast<unsigned>(n_split));
  const int64_t n_q = a.n_tokens * a.group;
  if (n_q <= 1) {
    attention_decode_kernel<DPL, 1><<<grid, kDecodeWarps * 32, 0, stream>>>(a);
  } else if (n_q <= 2) {
    attention_decode_kernel<DPL, 2><<<grid, kDecodeWarps * 32, 0, stream>>>(a);
  } else if (n_q <= 4) {
    attention_decode_kernel<DPL, 4><<<grid, kDecodeWarps * 32, 0, stream>>>(a);
  } else {
    attention_decode_kernel<DPL, 8><<<grid, kDecodeWarps * 32, 0, stream>>>(a);
  }
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool attention_decode_serves(const AttnArgs& a) {
  const int hd = std::max(a.hd_k, a.hd_v);
  return a.n_tokens * a.group <= kDecodeMaxRows && hd > 32 && hd <= kMaxHeadDim;
}

void launch_attention_decode(const AttnArgs& a, int64_t n_head_kv, int n_split,
                             cudaStream_t stream) {
  const int hd = std::max(a.hd_k, a.hd_v);
  if (hd <= 64) {
    launch_rows<2>(a, n_head_kv, n_split, stream);
  } else if (hd <= 128) {
    launch_rows<4>(a, n_head_kv, n_split, stream);
  } else {
    launch_rows<8>(a, n_head_kv, n_split, stream);
  }
}

}  // namespace moe::cuda
