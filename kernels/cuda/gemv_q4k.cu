// Decode GEMVs of Q4_K weights (one activation row per matrix or group), and the fused
// gate/up/SwiGLU of a MoE layer's decode items.
//
// The general GEMV (matmul_kernels.cuh) spends ~9 instructions per Q4_K weight on per-8-weight
// bookkeeping; a warp-per-row version without shared memory was slower still, each warp
// re-reading the whole activation row through L1/L2. Here a block of 8 warps stages the row in
// shared memory once (padded against bank conflicts); a lane takes a 64-weight half of a
// super-block (32 bytes of nibbles, 16-byte loads, one scale/min pair per 32-weight sub-block)
// for two weight rows at a time, ~4 instructions per weight; a warp-shuffle sum finishes each
// row. Rows shorter than 32 halves (768-wide expert downs) are shared by segments of 4 lanes, so
// no lane idles. In the fused form the two rows are an expert's gate and up rows, and the lane
// holding the sums writes silu(gate) * up. H200, weights from DRAM (moe-bench-cuda-kernels): a 2048
// x 4096 GEMV 7.8 -> 5.0 us; 8 experts' gate + up + SwiGLU 10.6 us against ~23.5 as three launches
// (docs/performance-log.md).
#include <cstdint>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant_device.cuh"
#include "kernels/cuda/expert_matmul.h"
#include "kernels/cuda/matmul_kernels.cuh"

namespace moe::cuda {
namespace detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// The staged row is padded by 4 floats after every 64: lane c reads half c at float c * 68, so the
// 8 lanes of a 16-byte shared load phase hit 8 different 4-bank groups (unpadded, the 256-byte
// stride put all 8 on the same banks: ncu showed the warps stalled on shared memory ~70% of
// the time).
constexpr int kHalfStride = 68;
constexpr int64_t kMaxInputs = 11264;  // padded: 46.75 KiB of shared memory, under the 48 KiB

// The 8 words of nibbles of half k of the super-block at b (16-byte loads when aligned).
__device__ __forceinline__ void load_half(const uint8_t* b, int k, bool al16, uint32_t (&q)[8]) {
  const uint8_t* qs = b + 16 + 32 * k;
  if (al16) {
    const uint4 v0 = __ldg(reinterpret_cast<const uint4*>(qs));
    const uint4 v1 = __ldg(reinterpret_cast<const uint4*>(qs) + 1);
    q[0] = v0.x, q[1] = v0.y, q[2] = v0.z, q[3] = v0.w;
    q[4] = v1.x, q[5] = v1.y, q[6] = v1.z, q[7] = v1.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = dq::ld_u32(qs + 4 * i);
  }
}

// s_lo += the 4 low nibbles of word q times xl, s_hi += its 4 high nibbles times xh (in order).
__device__ __forceinline__ void nibble_dot(uint32_t q, float4 xl, float4 xh, float& s_lo,
                                           float& s_hi) {
  const uint32_t lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
  s_lo = fmaf(dq::byte_to_float(lo, 0, 0.0f), xl.x, s_lo);
  s_lo = fmaf(dq::byte_to_float(lo, 1, 0.0f), xl.y, s_lo);
  s_lo = fmaf(dq::byte_to_float(lo, 2, 0.0f), xl.z, s_lo);
  s_lo = fmaf(dq::byte_to_float(lo, 3, 0.0f), xl.w, s_lo);
  s_hi = fmaf(dq::byte_to_float(hi, 0, 0.0f), xh.x, s_hi);
  s_hi = fmaf(dq::byte_to_float(hi, 1, 0.0f), xh.y, s_hi);
  s_hi = fmaf(dq::byte_to_float(hi, 2, 0.0f), xh.z, s_hi);
  s_hi = fmaf(dq::byte_to_float(hi, 3, 0.0f), xh.w, s_hi);
}

// d * (sc_lo * s_lo + sc_hi * s_hi) - dmin * (m_lo * x_lo + m_hi * x_hi) for half k of the
// super-block at b, given the nibble dot products s and the activation sums x of its two
// sub-blocks (w = d * sc * q - dmin * m).
__device__ __forceinline__ float finish_half(const uint8_t* b, int k, float s_lo, float s_hi,
                                             float x_lo, float x_hi) {
  uint32_t sc_lo, m_lo, sc_hi, m_hi;
  dq::scale_min_k4(2 * k, b + 4, sc_lo, m_lo);
  dq::scale_min_k4(2 * k + 1, b + 4, sc_hi, m_hi);
  const float sums =
      dq::small_int_to_float(sc_lo, 0.0f) * s_lo + dq::small_int_to_float(sc_hi, 0.0f) * s_hi;
  const float mins =
      dq::small_int_to_float(m_lo, 0.0f) * x_lo + dq::small_int_to_float(m_hi, 0.0f) * x_hi;
  return dq::ld_f16(b) * sums - dq::ld_f16(b + 2) * mins;
}

// Output rows a segment computes: two (A and B) for full-warp rows; one for the gate/up form (its
// A and B are one row's gate and up) and for short rows, so their product has twice the warps
// to hide latency with.
template <bool kGateUp, int SW>
constexpr int rows_per_segment() {
  return kGateUp || SW < 32 ? 1 : 2;
}

// Grid: x = output rows / rows per block, y = group. A warp is split into segments of SW lanes
// (SW = 32 unless a row has fewer halves than a warp has lanes: 768-wide expert downs have 12,
// which left 20 of 32 lanes idle); each segment computes two weight rows A and B against the
// staged activation row: rows o and o + 1 of the group's matrix (one row, A, in segments of
// short rows: twice the warps to hide latency with, 8.7 -> 6.5 us for 8 experts' Q4_K down), or
// (kGateUp) row o of the group's gate matrix (a.w_ptrs) and of its up matrix (up_ptrs), written
// as silu(A) * B.
// Dynamic shared memory: n_in / 64 * kHalfStride floats. (Two gate/up rows per segment, to fit
// the fused grid in one wave, were slower: 10.6 -> 11.7 us at 80 registers with spills.)
template <bool kGateUp, int SW>
__global__ void __launch_bounds__(kThreads) gemv_q4k_kernel(Args a, const void* const* up_ptrs) {
  extern __shared__ __align__(16) float xs[];
  constexpr int kRowsPerSeg = rows_per_segment<kGateUp, SW>();
  constexpr int kRowsPerBlock = kWarps * (32 / SW) * kRowsPerSeg;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int seg = lane / SW, sl = lane % SW;
  int64_t r0, r1;
  const uint8_t* w = group_range(a, static_cast<int>(blockIdx.y), r0, r1);
  const uint8_t* w_up = nullptr;
  if constexpr (kGateUp) w_up = static_cast<const uint8_t*>(up_ptrs[blockIdx.y]);
  const int64_t ob = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  if (!w || (kGateUp && !w_up)) return fill_nan(a, r0, r1, ob, kRowsPerBlock);

  const int64_t oa = ob + (warp * (32 / SW) + seg) * kRowsPerSeg;
  const bool active = oa < a.n_out;  // all lanes still join the barriers and shuffles
  const bool has_b = kGateUp ? active : kRowsPerSeg == 2 && oa + 1 < a.n_out;
  const int64_t row = active ? oa : 0;
  const uint8_t* wa = w + row * static_cast<int64_t>(a.row_bytes);
  const uint8_t* wb =
      kGateUp ? w_up + row * static_cast<int64_t>(a.row_bytes) : (has_b ? wa + a.row_bytes : wa);
  const bool al16 =
      (reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(w_up)) % 16 == 0 &&
      a.row_bytes % 16 == 0;
  const int64_t n_halves = a.n_in / 64;

  for (int64_t j = r0; j < r1; ++j) {
    const float* x = x_row(a, j);
    if (j > r0) __syncthreads();  // every warp is done with the previous row
    stage_padded_row<kThreads, 64, kHalfStride>(xs, x, a.n_in, a.x_vec4);
    __syncthreads();
    float acc_a = 0.0f, acc_b = 0.0f;
    if (active) {
      for (int64_t c = sl; c < n_halves; c += SW) {
        const int k = static_cast<int>(c % 4);
        const uint8_t* ba = wa + (c / 4) * 144;
        const uint8_t* bb = wb + (c / 4) * 144;
        uint32_t qa[8], qb[8];
        load_half(ba, k, al16, qa);
        if (has_b) load_half(bb, k, al16, qb);
        const float* xc = xs + c * kHalfStride;
        float sa_lo = 0.0f, sa_hi = 0.0f, sb_lo = 0.0f, sb_hi = 0.0f, x_lo = 0.0f, x_hi = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float4 xl = *reinterpret_cast<const float4*>(xc + 4 * i);
          const float4 xh = *reinterpret_cast<const float4*>(xc + 32 + 4 * i);
          x_lo += (xl.x + xl.y) + (xl.z + xl.w);
          x_hi += (xh.x + xh.y) + (xh.z + xh.w);
          nibble_dot(qa[i], xl, xh, sa_lo, sa_hi);
          if (has_b) nibble_dot(qb[i], xl, xh, sb_lo, sb_hi);
        }
        acc_a += finish_half(ba, k, sa_lo, sa_hi, x_lo, x_hi);
        if (has_b) acc_b += finish_half(bb, k, sb_lo, sb_hi, x_lo, x_hi);
      }
    }
    acc_a = segment_sum<SW>(acc_a);
    acc_b = segment_sum<SW>(acc_b);
    if (active && sl == 0) {
      float* y = a.y + j * a.n_out;
      if constexpr (kGateUp) {
        y[oa] = acc_a / (1.0f + expf(-acc_a)) * acc_b;  // elementwise.cu's swiglu
      } else {
        y[oa] = acc_a;
        if (has_b) y[oa + 1] = acc_b;
      }
    }
  }
}

template <bool kGateUp, int SW>
void launch_sw(const Args& a, unsigned n_groups, const void* const* up_ptrs, cudaStream_t stream) {
  constexpr int64_t rows_per_block = kWarps * (32 / SW) * rows_per_segment<kGateUp, SW>();
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n_out, rows_per_block)), n_groups);
  const size_t smem = static_cast<size_t>(a.n_in / 64 * kHalfStride) * sizeof(float);
  gemv_q4k_kernel<kGateUp, SW><<<grid, kThreads, smem, stream>>>(a, up_ptrs);
  MOE_CUDA_CHECK(cudaGetLastError());
}

// Segments of 4 lanes when a row's halves split evenly that way and do not fill a warp.
template <bool kGateUp>
void launch(const Args& a, unsigned n_groups, const void* const* up_ptrs, cudaStream_t stream) {
  const int64_t n_halves = a.n_in / 64;
  if (n_halves < 32 && n_halves % 4 == 0) {
    launch_sw<kGateUp, 4>(a, n_groups, up_ptrs, stream);
  } else {
    launch_sw<kGateUp, 32>(a, n_groups, up_ptrs, stream);
  }
}

}  // namespace

bool launch_gemv_q4k(const Args& a, unsigned n_groups, cudaStream_t stream) {
  if (a.n_in > kMaxInputs || a.n_in % 256 != 0) return false;
  launch<false>(a, n_groups, nullptr, stream);
  return true;
}

}  // namespace detail

bool fused_gate_up_supported(GgmlType gate, GgmlType up, int64_t n_in) {
  return gate == GgmlType::Q4_K && up == GgmlType::Q4_K && n_in > 0 && n_in % 256 == 0 &&
         n_in <= detail::kMaxInputs;
}

void grouped_gate_up_swiglu(GgmlType type, int64_t n_in, int64_t n_out, size_t row_bytes,
                            const void* const* gate_ptrs, const void* const* up_ptrs,
                            const int32_t* offsets, int32_t n_items, const int32_t* x_rows,
                            const float* x, int64_t x_stride, float* h, cudaStream_t stream) {
  if (!fused_gate_up_supported(type, type, n_in)) {
    throw Error(
        "grouped_gate_up_swiglu: " + std::string(ggml_type_label(static_cast<uint32_t>(type))) +
        " with " + std::to_string(n_in) +
        " inputs is not supported (Q4_K, n_in a multiple "
        "of 256 up to " +
        std::to_string(detail::kMaxInputs) + ")");
  }
  const auto min_row = ggml_row_bytes(type, static_cast<uint64_t>(n_in));
  if (n_out < 1 || !min_row || row_bytes < *min_row || row_bytes % 4 != 0) {
    throw Error("grouped_gate_up_swiglu: invalid shape (n_out " + std::to_string(n_out) +
                ", row_bytes " + std::to_string(row_bytes) + ")");
  }
  if (n_items < 0 || n_items > 65535) {
    throw Error("grouped_gate_up_swiglu: n_items " + std::to_string(n_items) +
                " outside [0, 65535]");
  }
  if (n_items == 0) return;
  if (!gate_ptrs || !up_ptrs || !offsets || !x_rows || !x || !h) {
    throw Error("grouped_gate_up_swiglu: null device pointer");
  }
  if (x_stride < n_in) throw Error("grouped_gate_up_swiglu: x_stride < n_in");
  detail::Args a{};
  a.n_in = n_in;
  a.n_out = n_out;
  a.row_bytes = row_bytes;
  a.w_ptrs = gate_ptrs;
  a.offsets = offsets;
  a.x_rows = x_rows;
  a.x = x;
  a.x_stride = x_stride;
  a.y = h;
  a.x_vec4 = reinterpret_cast<uintptr_t>(x) % 16 == 0 && x_stride % 4 == 0;
  detail::launch<true>(a, static_cast<unsigned>(n_items), up_ptrs, stream);
}

}  // namespace moe::cuda
