// Decode GEMV of Q6_K weights (one activation row per matrix or group): the output head, the
// Q6_K attn_v and ffn_down layers of the Q4_K_M mixes.
//
// As gemv_q4k.cu: a block of 8 warps stages the activation row in shared memory once (padded
// against bank conflicts) and each warp computes two weight rows, a warp-shuffle sum finishing
// each. A lane takes 32 weights of a super-block at a time (a quarter-row group l0 .. l0 + 7 of
// one 128-weight half, in its four 32-apart sub-groups): 24 bytes of quants and 4 scale bytes,
// ~3 instructions per weight, against ~9 in the general GEMV's per-8-weight decode. Rows of
// fewer than 32 groups (768-wide expert downs: 24) are shared by segments of 8 lanes. Q6_K blocks
// are 210 bytes, so only 2-byte loads are safe.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant_device.cuh"
#include "kernels/cuda/matmul_kernels.cuh"

namespace moe::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerSeg = 2;
// Staged row: 4 floats of padding after every 128, so the two halves of a super-block (128
// floats apart) read by neighbouring lanes fall on different banks.
constexpr int kChunkFloats = 128;
constexpr int kChunkStride = 132;
constexpr int64_t kMaxInputs = 11264;  // padded: 45.4 KiB of shared memory, under the 48 KiB
// Below this many output rows the general GEMV, which splits K over more blocks, is as fast.
constexpr int64_t kMinRows = 2048;

template <int SW>
constexpr int64_t rows_per_block() {
  return kWarps * (32 / SW) * kRowsPerSeg;
}

// The quants of group c (super-block c / 8, half (c / 4) % 2, l0 = 8 (c % 4)) of one row: the low
// 4 bits of its first and second sub-group pairs (ql at l0 and l0 + 32), the high 2 bits (qh at
// l0), 4 scales and d.
struct Group {
  uint32_t ql0[2], ql1[2], qh[2];
  float sc[4];
  float d;
};

__device__ __forceinline__ void load_group(const uint8_t* row, int64_t c, Group& g) {
  const uint8_t* b = row + (c / 8) * 210;
  const int n = static_cast<int>((c / 4) % 2), l0 = 8 * static_cast<int>(c % 4);
  dq::ld8_a2(b + 64 * n + l0, g.ql0[0], g.ql0[1]);
  dq::ld8_a2(b + 64 * n + l0 + 32, g.ql1[0], g.ql1[1]);
  dq::ld8_a2(b + 128 + 32 * n + l0, g.qh[0], g.qh[1]);
  const uint8_t* sc = b + 192 + 8 * n + l0 / 16;
#pragma unroll
  for (int k = 0; k < 4; ++k) g.sc[k] = dq::int8_to_float(dq::ld_u8(sc + 2 * k));
  g.d = dq::ld_f16(b + 208);
}

// Sub-group k (weights l0 + 32k .. + 7 of the half) of one row as 4-weight words of 6-bit
// quants (bias 32 still in).
__device__ __forceinline__ uint32_t quants(const Group& g, int k, int w) {
  const uint32_t lo = k % 2 == 0 ? g.ql0[w] : g.ql1[w];
  const uint32_t nib = k < 2 ? lo & 0x0F0F0F0Fu : (lo >> 4) & 0x0F0F0F0Fu;
  return nib | (((g.qh[w] >> (2 * k)) & 0x03030303u) << 4);
}

// The group's 32 weights of one row against the staged activations at xc (its half's first
// float, padded layout: the four sub-groups at 32k + l0 are inside one 128-float chunk).
__device__ __forceinline__ float group_dot(const Group& g, const float* xc, int l0) {
  float total = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 x0 = *reinterpret_cast<const float4*>(xc + 32 * k + l0);
    const float4 x1 = *reinterpret_cast<const float4*>(xc + 32 * k + l0 + 4);
    const uint32_t q0 = quants(g, k, 0), q1 = quants(g, k, 1);
    float s = dq::byte_to_float(q0, 0, 32.0f) * x0.x;
    s = fmaf(dq::byte_to_float(q0, 1, 32.0f), x0.y, s);
    s = fmaf(dq::byte_to_float(q0, 2, 32.0f), x0.z, s);
    s = fmaf(dq::byte_to_float(q0, 3, 32.0f), x0.w, s);
    s = fmaf(dq::byte_to_float(q1, 0, 32.0f), x1.x, s);
    s = fmaf(dq::byte_to_float(q1, 1, 32.0f), x1.y, s);
    s = fmaf(dq::byte_to_float(q1, 2, 32.0f), x1.z, s);
    s = fmaf(dq::byte_to_float(q1, 3, 32.0f), x1.w, s);
    total = fmaf(g.sc[k], s, total);
  }
  return g.d * total;
}

// Grid: x = output rows / rows per block, y = group. A warp is split into segments of SW lanes
// (SW = 32 unless a row has fewer groups than a warp has lanes: 768-wide expert downs have 24);
// segment s computes rows o and o + 1. Dynamic shared memory: the padded activation row.
template <int SW>
__global__ void __launch_bounds__(kThreads) gemv_q6k_kernel(Args a) {
  extern __shared__ __align__(16) float xs[];
  constexpr int kRowsPerBlock = rows_per_block<SW>();
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int seg = lane / SW, sl = lane % SW;
  int64_t r0, r1;
  const uint8_t* w = group_range(a, static_cast<int>(blockIdx.y), r0, r1);
  const int64_t ob = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  if (!w) return fill_nan(a, r0, r1, ob, kRowsPerBlock);
  const int64_t oa = ob + (warp * (32 / SW) + seg) * kRowsPerSeg;
  const bool active = oa < a.n_out;  // all lanes still join the barriers and shuffles
  const bool has_b = oa + 1 < a.n_out;
  const uint8_t* wa = w + (active ? oa : 0) * static_cast<int64_t>(a.row_bytes);
  const uint8_t* wb = has_b ? wa + a.row_bytes : wa;
  const int64_t n_groups = a.n_in / 32;

  for (int64_t j = r0; j < r1; ++j) {
    const float* x = x_row(a, j);
    if (j > r0) __syncthreads();  // every warp is done with the previous row
    stage_padded_row<kThreads, kChunkFloats, kChunkStride>(xs, x, a.n_in, a.x_vec4);
    __syncthreads();
    float acc_a = 0.0f, acc_b = 0.0f;
    if (active) {
      for (int64_t c = sl; c < n_groups; c += SW) {
        Group ga, gb;
        load_group(wa, c, ga);
        if (has_b) load_group(wb, c, gb);
        const float* xc = xs + (c / 4) * kChunkStride;  // the half's 128 floats
        const int l0 = 8 * static_cast<int>(c % 4);
        acc_a += group_dot(ga, xc, l0);
        if (has_b) acc_b += group_dot(gb, xc, l0);
      }
    }
    acc_a = segment_sum<SW>(acc_a);
    acc_b = segment_sum<SW>(acc_b);
    if (active && sl == 0) {
      float* y = a.y + j * a.n_out;
      y[oa] = acc_a;
      if (has_b) y[oa + 1] = acc_b;
    }
  }
}

template <int SW>
void launch_sw(const Args& a, unsigned n_groups, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n_out, rows_per_block<SW>())), n_groups);
  const size_t smem = static_cast<size_t>(a.n_in / kChunkFloats * kChunkStride) * sizeof(float);
  gemv_q6k_kernel<SW><<<grid, kThreads, smem, stream>>>(a);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool launch_gemv_q6k(const Args& a, unsigned n_groups, cudaStream_t stream) {
  if (a.n_in > kMaxInputs || a.n_in % 256 != 0) return false;
  if (a.n_out * static_cast<int64_t>(n_groups) < kMinRows) return false;
  // Segments of 8 lanes when a row's groups split evenly that way and do not fill a warp.
  const int64_t groups = a.n_in / 32;
  if (groups < 32 && groups % 8 == 0) {
    launch_sw<8>(a, n_groups, stream);
  } else {
    launch_sw<32>(a, n_groups, stream);
  }
  return true;
}

}  // namespace moe::cuda::detail
