// The decode-step attention kernel (attention_decode.cuh). A block owns one KV head and one slice
// of the cache positions; its 4 warps take every 4th position of the slice. Each warp streams its
// positions' K and V head slices into its own ring of kStages shared-memory stages by cp.async, so
// kStages - 1 positions are in flight while one is computed: the copies cannot be sunk towards
// their use by the compiler, as register prefetches were, and cost no registers. Lane l then takes
// head dims [l * DPL, l * DPL + DPL) of the K and V rows (and of every query row) from the stage.
// Each position's NQ partial dot products are summed across the warp by a transposed butterfly
// (NQ - 1 + 5 - log2 NQ shuffles instead of 5 NQ), which leaves each lane the score of query lane
// >> (5 - log2 NQ); that lane's online softmax step is broadcast to all lanes for the p·v update.
// The warps' (m, l, acc) are combined through shared memory at the end, into the output or into
// the partials of attention.cu's merge.
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
constexpr int kStages = 8;  // positions per warp in shared memory: kStages - 1 in flight

// Bytes of n values of a cache type (n a multiple of 32 for the block types).
__host__ __device__ inline int64_t kv_bytes(int code, int64_t n) {
  switch (code) {
    case kKvF32:
      return 4 * n;
    case kKvF16:
    case kKvBF16:
      return 2 * n;
    case kKvQ8_0:
      return n / 32 * 34;
    case kKvQ4_1:
      return n / 32 * 20;
    case kKvQ5_0:
      return n / 32 * 22;
    case kKvQ5_1:
      return n / 32 * 24;
    default:  // Q4_0, IQ4_NL
      return n / 32 * 18;
  }
}

// A head slice's copy unit: the largest of 16, 8, 4 bytes dividing its size, its first head's
// address and the row pitch (so every head of every row is aligned to it); 0 when none does.
inline int copy_unit(const uint8_t* base, size_t row_bytes, int64_t slice_bytes) {
  for (int u = 16; u >= 4; u /= 2) {
    if (reinterpret_cast<uintptr_t>(base) % u == 0 && row_bytes % u == 0 && slice_bytes % u == 0) {
      return u;
    }
  }
  return 0;
}

__host__ __device__ constexpr int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

// One unit of a head slice from global into shared memory, asynchronously (cp.async, sm_80+).
__device__ __forceinline__ void copy_unit_async(uint8_t* dst, const uint8_t* src, int unit) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (unit == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
  } else if (unit == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
  }
#else
  for (int i = 0; i < unit; i += 4) {
    *reinterpret_cast<uint32_t*>(dst + i) = *reinterpret_cast<const uint32_t*>(src + i);
  }
#endif
}

__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most `kPending` of this thread's committed copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

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

// How a warp copies its positions' head slices into its stages (bytes; units from copy_unit).
struct SliceCopy {
  int k_bytes, v_bytes;  // one head's K / V slice
  int k_unit, v_unit;
  int v_at;         // the V slice's offset in a stage (16-byte aligned)
  int stage_bytes;  // a stage: K slice, V slice, each rounded up to 16 bytes
};

template <int DPL, int NQ>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    attention_decode_kernel(AttnArgs a, SliceCopy c) {
  constexpr int kShift = 5 - log2_rows<NQ>();  // lanes per query row after the reduction
  // The warps' stages while they walk the positions; then their states for the final combine.
  extern __shared__ __align__(16) uint8_t smem[];
  auto& s_acc = *reinterpret_cast<float(*)[kDecodeWarps][NQ][32 * DPL]>(smem);
  auto& s_m = *reinterpret_cast<float(*)[kDecodeWarps][NQ]>(smem + sizeof(s_acc));
  auto& s_l = *reinterpret_cast<float(*)[kDecodeWarps][NQ]>(smem + sizeof(s_acc) + sizeof(s_m));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int hk = static_cast<int>(blockIdx.y);
  const int n_q = static_cast<int>(a.n_tokens) * a.group;  // <= NQ (attention_decode_serves)
  // A refused device position reads nothing past the batch's own rows (as attention.cu).
  const int64_t pos0 = batch_pos0(a.device_pos0, a.pos0, a.n_tokens, a.n_ctx);
  // The slices cover only what the batch sees: with a window, the positions before it are in no
  // slice and never read.
  const int64_t lo = split_first(a.window, pos0);
  const int64_t split_len = split_length(pos0 + a.n_tokens - lo, a.split_bound);
  const int64_t p_begin = lo + static_cast<int64_t>(blockIdx.z) * split_len;
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
  const int64_t own_vis = own < n_q ? pos0 + own / a.group + 1 : 0;  // causal: [.., pos0 + t]
  const int64_t own_first = first_visible(a.window, pos0 + own / a.group);
  float m = -INFINITY, l = 0.0f;
  float acc[NQ][DPL];
#pragma unroll
  for (int g = 0; g < NQ; ++g) {
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[g][i] = 0.0f;
  }

  constexpr int W = kDecodeWarps;
  uint8_t* const ring = smem + static_cast<size_t>(warp) * kStages * c.stage_bytes;
  const uint8_t* const k_head = a.k + static_cast<int64_t>(hk) * c.k_bytes;
  const uint8_t* const v_head = a.v + static_cast<int64_t>(hk) * c.v_bytes;
  const int k_units = c.k_bytes / c.k_unit, v_units = c.v_bytes / c.v_unit;
  // Position pos's slices into stage `slot`; always one commit, so every lane counts the same
  // groups (a position past the slice copies nothing).
  const auto issue = [&](int64_t pos, int slot) {
    if (pos < p_end) {
      uint8_t* st = ring + slot * c.stage_bytes;
      const uint8_t* kr = k_head + kv_row(pos, a.ring) * static_cast<int64_t>(a.k_row_bytes);
      const uint8_t* vr = v_head + kv_row(pos, a.ring) * static_cast<int64_t>(a.v_row_bytes);
      for (int u = lane; u < k_units + v_units; u += 32) {
        if (u < k_units) {
          copy_unit_async(st + u * c.k_unit, kr + u * c.k_unit, c.k_unit);
        } else {
          const int uv = u - k_units;
          copy_unit_async(st + c.v_at + uv * c.v_unit, vr + uv * c.v_unit, c.v_unit);
        }
      }
    }
    copy_commit();
  };
  const auto step = [&](int64_t pos, const uint8_t* st) {
    float kr[DPL], vr[DPL];
    load_run<DPL>(a.k_code, st, d0, k_valid, kr);
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
    load_run<DPL>(a.v_code, st + c.v_at, d0, v_valid, vr);
    float sc = transposed_warp_sum<NQ>(s, lane);
    sc = pos < own_vis && pos >= own_first ? sc * a.scale : -INFINITY;
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
  // The ring: positions p .. p + (kStages - 2) W in flight when p is computed. The loop bound is
  // the same for the whole warp, so the copies, waits and shuffles are warp-uniform.
  int64_t p = p_begin + warp;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(p + s * W, s);
  for (int slot = 0; p < p_end; p += W, slot = slot + 1 == kStages ? 0 : slot + 1) {
    // Into the stage computed last round (every lane is past it: the __syncwarp below).
    issue(p + (kStages - 1) * W, slot == 0 ? kStages - 1 : slot - 1);
    copy_wait<kStages - 1>();  // p's group is complete for this lane ...
    __syncwarp();              // ... and for every lane, and visible to all
    step(p, ring + slot * c.stage_bytes);
    __syncwarp();
  }
  copy_wait<0>();
  __syncthreads();  // the stages become the states' space

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
      if (a.sinks) {
        const SinkNorm sn = sink_norm(mx, lsum, a.sinks[h]);
        a.out[qidx * a.hd_v + d] = __fmul_rn(o, sn.c) / sn.den;
      } else {
        a.out[qidx * a.hd_v + d] = o / lsum;
      }
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

// The slices' sizes and copy units (0 when a side cannot be copied by units: see serves()).
SliceCopy slice_copy(const AttnArgs& a) {
  SliceCopy c{};
  c.k_bytes = static_cast<int>(kv_bytes(a.k_code, a.hd_k));
  c.v_bytes = static_cast<int>(kv_bytes(a.v_code, a.hd_v));
  c.k_unit = copy_unit(a.k, a.k_row_bytes, c.k_bytes);
  c.v_unit = copy_unit(a.v, a.v_row_bytes, c.v_bytes);
  c.v_at = static_cast<int>(round16(c.k_bytes));
  c.stage_bytes = static_cast<int>(round16(c.k_bytes) + round16(c.v_bytes));
  return c;
}

template <int DPL, int NQ>
void launch_kernel(const AttnArgs& a, const SliceCopy& c, dim3 grid, cudaStream_t stream) {
  const size_t states = sizeof(float) * kDecodeWarps * NQ * (32 * DPL + 2);
  const size_t smem = std::max(states, static_cast<size_t>(kDecodeWarps) * kStages * c.stage_bytes);
  if (smem > 48 * 1024) {  // f32 caches of wide heads: above the default dynamic limit
    MOE_CUDA_CHECK(cudaFuncSetAttribute(attention_decode_kernel<DPL, NQ>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  }
  attention_decode_kernel<DPL, NQ><<<grid, kDecodeWarps * 32, smem, stream>>>(a, c);
  MOE_CUDA_CHECK(cudaGetLastError());
}

template <int DPL>
void launch_rows(const AttnArgs& a, int64_t n_head_kv, int n_split, cudaStream_t stream) {
  const dim3 grid(1, static_cast<unsigned>(n_head_kv), static_cast<unsigned>(n_split));
  const SliceCopy c = slice_copy(a);
  const int64_t n_q = a.n_tokens * a.group;
  if (n_q <= 1) {
    launch_kernel<DPL, 1>(a, c, grid, stream);
  } else if (n_q <= 2) {
    launch_kernel<DPL, 2>(a, c, grid, stream);
  } else if (n_q <= 4) {
    launch_kernel<DPL, 4>(a, c, grid, stream);
  } else {
    launch_kernel<DPL, 8>(a, c, grid, stream);
  }
}

}  // namespace

bool attention_decode_serves(const AttnArgs& a) {
  const int hd = std::max(a.hd_k, a.hd_v);
  // A block type's head slice must start on a block (head dims of whole blocks), and each side
  // must split into copy units.
  const auto whole_blocks = [](int code, int d) {
    return code == kKvF32 || code == kKvF16 || code == kKvBF16 || d % 32 == 0;
  };
  const SliceCopy c = slice_copy(a);
  return a.n_tokens * a.group <= kDecodeMaxRows && hd > 32 && hd <= kMaxHeadDim &&
         whole_blocks(a.k_code, a.hd_k) && whole_blocks(a.v_code, a.hd_v) && c.k_unit > 0 &&
         c.v_unit > 0;
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
