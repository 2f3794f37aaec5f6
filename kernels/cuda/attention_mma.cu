// Causal GQA attention on tensor cores, flash-attention style (see attention_mma.cuh for when it
// runs).
//
// A block owns one KV head and kMmaRows query rows (row = (token, query head of that KV head), the
// heads of a token side by side), 16 rows per warp. It walks its slice of cache positions in tiles
// of kMmaTile, decoded to f16 in shared memory once for all rows. Per tile each warp computes
// S = Q·K^T (16 × kMmaTile) with mma.sync m16n8k16 into f32 registers, masks and scales it, keeps
// an online softmax per row (max m, sum l) and adds P·V into f32 accumulators, with P taken
// straight from the S registers (the accumulator layout of one mma is the operand layout of the
// next). Only the slices and partials differ from the f32 kernel: the merge kernel of attention.cu
// combines both alike.
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/kv_rows.cuh"

namespace moe::cuda {
namespace {

constexpr int kMmaWarps = kMmaRows / 16;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaTile = 32;  // positions per tile: a multiple of 16 dividing kSplitAlign
static_assert(kSplitAlign % kMmaTile == 0, "a split is whole tiles");

// Shared-memory row stride in halves: 8 more than the head so the 8 row groups of an mma operand
// load fall in different banks (and rows stay 16-byte aligned).
template <int HD>
constexpr int row_stride() {
  return HD + 8;
}
template <int HD>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(kMmaRows + 2 * kMmaTile) * row_stride<HD>() * sizeof(__half);
}

__device__ __forceinline__ uint32_t ld_smem_u32(const __half* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack_halves(__half lo, __half hi) {
  return static_cast<uint32_t>(__half_as_ushort(lo)) |
         (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
}

// d += a·b for one m16n8k16 tile: a 16×16 row-major f16, b 16×8 column-major f16, d f32.
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// Rows p0 .. p0 + kMmaTile of one side of the cache (the head at element `off`, hd values) into
// dst [kMmaTile][row_stride] as f16, 8 values per thread and step; zeros past p_end (rows there
// may be unwritten: NaN times a zero probability would still be NaN) and past hd.
template <int kCode, int HD>
__device__ __forceinline__ void load_tile_t(__half* dst, const uint8_t* base, size_t row_bytes,
                                            int64_t ring, int64_t off, int hd, int64_t p0,
                                            int64_t p_end) {
  constexpr int kChunks = kMmaTile * HD / 8;
  for (int c = static_cast<int>(threadIdx.x); c < kChunks; c += kMmaThreads) {
    const int r = c / (HD / 8), d = c % (HD / 8) * 8;
    const int64_t pos = p0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (pos < p_end && d < hd) {
      const uint8_t* row = base + kv_row(pos, ring) * static_cast<int64_t>(row_bytes);
      if constexpr (kCode == kKvF16) {
        // attention_mma_serves() guarantees whole, 16-byte aligned groups of 8 (see launch).
        v = *reinterpret_cast<const uint4*>(row + 2 * (off + d));
      } else {
        float x[8];
        if (d + 8 <= hd && (off + d) % 8 == 0) {
          kv_run8<kCode>(row, off + d, x);  // one block's scales read once for the 8 values
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) x[i] = d + i < hd ? kv_value<kCode>(row, off + d + i) : 0.0f;
        }
        v = make_uint4(pack_half2(x[0], x[1]), pack_half2(x[2], x[3]), pack_half2(x[4], x[5]),
                       pack_half2(x[6], x[7]));
      }
    }
    *reinterpret_cast<uint4*>(dst + r * row_stride<HD>() + d) = v;
  }
}

template <int HD>
__device__ __forceinline__ void load_tile(int code, __half* dst, const uint8_t* base,
                                          size_t row_bytes, int64_t ring, int64_t off, int hd,
                                          int64_t p0, int64_t p_end) {
  switch (code) {
    case kKvF16:
      load_tile_t<kKvF16, HD>(dst, base, row_bytes, ring, off, hd, p0, p_end);
      break;
    case kKvQ8_0:
      load_tile_t<kKvQ8_0, HD>(dst, base, row_bytes, ring, off, hd, p0, p_end);
      break;
    case kKvQ4_0:
      load_tile_t<kKvQ4_0, HD>(dst, base, row_bytes, ring, off, hd, p0, p_end);
      break;
    case kKvBF16:
      load_tile_t<kKvBF16, HD>(dst, base, row_bytes, ring, off, hd, p0, p_end);
      break;
    case kKvQ4_1:
      load_tile_t<kKvQ4_1, HD>(dst, base, row_bytes, ring, off, hd, p0, p_end);
      break;
    case kKvQ5_0:
      load_tile_t<kKvQ5_0, HD>(dst, base, row_bytes, ring, off, hd, p0, p_end);
      break;
    case kKvIQ4_NL:
      load_tile_t<kKvIQ4_NL, HD>(dst, base, row_bytes, ring, off, hd, p0, p_end);
      break;
    default:
      load_tile_t<kKvQ5_1, HD>(dst, base, row_bytes, ring, off, hd, p0, p_end);
      break;
  }
}

// HD: the head dims padded to a multiple of 16 (q and K zero-padded contribute nothing; padded V
// columns are not written out). Grid: x = row blocks, y = KV head, z = position slice.
template <int HD>
__global__ void __launch_bounds__(kMmaThreads, 2) attention_mma_kernel(AttnArgs a) {
  constexpr int S = row_stride<HD>();
  constexpr int NT = HD / 8;  // n-tiles of the output
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* qs = reinterpret_cast<__half*>(smem_raw);  // [kMmaRows][S]
  __half* ks = qs + kMmaRows * S;                    // [kMmaTile][S]
  __half* vs = ks + kMmaTile * S;                    // [kMmaTile][S]
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, tig = lane % 4;
  const int hk = static_cast<int>(blockIdx.y);
  const int64_t n_q = a.n_tokens * a.group;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  const int64_t pos0 = batch_pos0(a.device_pos0, a.pos0, a.n_tokens, a.n_ctx);
  // Slices over what the batch sees (split_first), and within a slice a window's block starts at
  // its first token's first position: tiles before it are not read.
  const int64_t lo = split_first(a.window, pos0);
  const int64_t split_len = split_length(pos0 + a.n_tokens - lo, a.split_bound);
  const int64_t t_last = (std::min(n_q, q0 + kMmaRows) - 1) / a.group;
  const int64_t p_begin = lo + static_cast<int64_t>(blockIdx.z) * split_len;
  const int64_t p_start = std::max(p_begin, first_visible(a.window, pos0 + q0 / a.group));
  const int64_t p_end = std::min(p_begin + split_len, pos0 + t_last + 1);

  // Q rows of the block as f16, zeros past the head and past the last row.
  for (int e = tid; e < kMmaRows * HD; e += kMmaThreads) {
    const int r = e / HD, d = e % HD;
    const int64_t qi = q0 + r;
    float x = 0.0f;
    if (qi < n_q && d < a.hd_k) {
      const int64_t t = qi / a.group;
      const int h = hk * a.group + static_cast<int>(qi % a.group);
      x = a.q[t * a.q_stride + static_cast<int64_t>(h) * a.hd_k + d];
    }
    qs[r * S + d] = __float2half_rn(x);
  }

  // This thread's two rows (g and g + 8 of the warp's 16): positions in [first, vis) are visible.
  const int64_t row_a = q0 + warp * 16 + g, row_b = row_a + 8;
  const int64_t vis_a = row_a < n_q ? pos0 + row_a / a.group + 1 : 0;
  const int64_t vis_b = row_b < n_q ? pos0 + row_b / a.group + 1 : 0;
  const int64_t first_a = first_visible(a.window, pos0 + row_a / a.group);
  const int64_t first_b = first_visible(a.window, pos0 + row_b / a.group);
  const int64_t warp_last = std::min(n_q, q0 + warp * 16 + 16) - 1;
  const int64_t warp_vis = warp_last >= q0 + warp * 16 ? pos0 + warp_last / a.group + 1 : 0;
  const int64_t warp_first = first_visible(a.window, pos0 + (q0 + warp * 16) / a.group);

  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;  // l: this lane's share
  const int64_t k_off = static_cast<int64_t>(hk) * a.hd_k;
  const int64_t v_off = static_cast<int64_t>(hk) * a.hd_v;

  for (int64_t p0 = p_start; p0 < p_end; p0 += kMmaTile) {
    __syncthreads();  // the previous tile is consumed
    load_tile<HD>(a.k_code, ks, a.k, a.k_row_bytes, a.ring, k_off, a.hd_k, p0, p_end);
    load_tile<HD>(a.v_code, vs, a.v, a.v_row_bytes, a.ring, v_off, a.hd_v, p0, p_end);
    __syncthreads();  // the tile (and, the first time, qs) is written
    if (p0 >= warp_vis || p0 + kMmaTile <= warp_first) continue;  // no row of the warp sees it

    // S = Q·K^T: 4 n-tiles of 8 positions; thread holds (g, 2tig..+1) and (g + 8, 2tig..+1).
    float s[kMmaTile / 8][4];
#pragma unroll
    for (int j = 0; j < kMmaTile / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const __half* qa = qs + (warp * 16 + g) * S + kk * 16 + 2 * tig;
      const uint32_t a0 = ld_smem_u32(qa), a1 = ld_smem_u32(qa + 8 * S);
      const uint32_t a2 = ld_smem_u32(qa + 8), a3 = ld_smem_u32(qa + 8 * S + 8);
#pragma unroll
      for (int j = 0; j < kMmaTile / 8; ++j) {
        const __half* kb = ks + (j * 8 + g) * S + kk * 16 + 2 * tig;
        mma_16816(s[j], a0, a1, a2, a3, ld_smem_u32(kb), ld_smem_u32(kb + 8));
      }
    }

    // Mask (causal, window, slice end), scale, and the online softmax of rows a and b; the 4 lanes
    // of a row group (same g) share each row's max.
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int j = 0; j < kMmaTile / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t pos = p0 + j * 8 + 2 * tig + (e & 1);
        const bool ok =
            pos < p_end && pos < (e < 2 ? vis_a : vis_b) && pos >= (e < 2 ? first_a : first_b);
        s[j][e] = ok ? s[j][e] * a.scale : -INFINITY;
      }
      mx_a = fmaxf(mx_a, fmaxf(s[j][0], s[j][1]));
      mx_b = fmaxf(mx_b, fmaxf(s[j][2], s[j][3]));
    }
#pragma unroll
    for (int w = 1; w < 4; w <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xFFFFFFFFu, mx_a, w));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xFFFFFFFFu, mx_b, w));
    }
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    // A row with nothing visible yet keeps m = -inf, l = 0, o = 0 (no exp of -inf - -inf).
    const float corr_a = mn_a == -INFINITY ? 1.0f : expf(m_a - mn_a);
    const float corr_b = mn_b == -INFINITY ? 1.0f : expf(m_b - mn_b);
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int j = 0; j < kMmaTile / 8; ++j) {
      s[j][0] = mn_a == -INFINITY ? 0.0f : expf(s[j][0] - mn_a);
      s[j][1] = mn_a == -INFINITY ? 0.0f : expf(s[j][1] - mn_a);
      s[j][2] = mn_b == -INFINITY ? 0.0f : expf(s[j][2] - mn_b);
      s[j][3] = mn_b == -INFINITY ? 0.0f : expf(s[j][3] - mn_b);
      sum_a += s[j][0] + s[j][1];
      sum_b += s[j][2] + s[j][3];
    }
    l_a = l_a * corr_a + sum_a;
    l_b = l_b * corr_b + sum_b;
    m_a = mn_a;
    m_b = mn_b;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      o[n][0] *= corr_a;
      o[n][1] *= corr_a;
      o[n][2] *= corr_b;
      o[n][3] *= corr_b;
    }

    // O += P·V, 16 positions per step: P's operand is two S n-tiles; V's is read down a column.
#pragma unroll
    for (int kk = 0; kk < kMmaTile / 16; ++kk) {
      const uint32_t a0 = pack_half2(s[2 * kk][0], s[2 * kk][1]);
      const uint32_t a1 = pack_half2(s[2 * kk][2], s[2 * kk][3]);
      const uint32_t a2 = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      const uint32_t a3 = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      const __half* vb = vs + (kk * 16 + 2 * tig) * S + g;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const __half* c = vb + n * 8;
        mma_16816(o[n], a0, a1, a2, a3, pack_halves(c[0], c[S]), pack_halves(c[8 * S], c[9 * S]));
      }
    }
  }

#pragma unroll
  for (int w = 1; w < 4; w <<= 1) {
    l_a += __shfl_xor_sync(0xFFFFFFFFu, l_a, w);
    l_b += __shfl_xor_sync(0xFFFFFFFFu, l_b, w);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = half == 0 ? row_a : row_b;
    if (row >= n_q) continue;
    const int64_t t = row / a.group;
    const int h = hk * a.group + static_cast<int>(row % a.group);
    const int64_t qidx = t * a.n_head + h;  // row of out / of the partials
    const float m = half == 0 ? m_a : m_b, l = half == 0 ? l_a : l_b;
    // One slice: o / l (the row's own position lies in it, so l > 0), divided as the merge
    // divides (with a sink as sink_norm() says), so a graph's fixed grid of mostly empty slices
    // gives the same bits. Else the partials.
    const bool whole = gridDim.z == 1;
    const SinkNorm sn = whole && a.sinks ? sink_norm(m, l, a.sinks[h]) : SinkNorm{};
    const auto finish = [&](float x) {
      return !whole ? x : a.sinks ? __fmul_rn(x, sn.c) / sn.den : x / l;
    };
    float* dst;
    if (whole) {
      dst = a.out + qidx * a.hd_v;
    } else {
      const int64_t pi = static_cast<int64_t>(blockIdx.z) * a.n_tokens * a.n_head + qidx;
      dst = a.part_acc + pi * a.hd_v;
      if (tig == 0) {
        a.part_ml[2 * pi] = m;
        a.part_ml[2 * pi + 1] = l;
      }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const int d = n * 8 + 2 * tig;
      const float x0 = o[n][2 * half], x1 = o[n][2 * half + 1];
      if (d < a.hd_v) dst[d] = finish(x0);
      if (d + 1 < a.hd_v) dst[d + 1] = finish(x1);
    }
  }
}

template <int HD>
void launch(const AttnArgs& a, int64_t n_head_kv, int n_split, cudaStream_t stream) {
  constexpr size_t bytes = smem_bytes<HD>();
  // Above 48 KiB a kernel must opt in (per device, so on every launch: a microsecond, and prompt
  // batches launch few).
  MOE_CUDA_CHECK(cudaFuncSetAttribute(attention_mma_kernel<HD>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
  const int64_t n_q = a.n_tokens * a.group;
  const dim3 grid(static_cast<unsigned>((n_q + kMmaRows - 1) / kMmaRows),
                  static_cast<unsigned>(n_head_kv), static_cast<unsigned>(n_split));
  attention_mma_kernel<HD><<<grid, kMmaThreads, bytes, stream>>>(a);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool attention_mma_serves(const AttnArgs& a) {
  const int hd = std::max(a.hd_k, a.hd_v);
  // An f16 side is copied 8 values (16 bytes) at a time: rows, the cache and each head's offset
  // must keep every copy 16-byte aligned.
  const auto f16_aligned = [](int code, const uint8_t* base, size_t row_bytes, int head_dim) {
    return code != kKvF16 || (reinterpret_cast<uintptr_t>(base) % 16 == 0 && row_bytes % 16 == 0 &&
                              head_dim % 8 == 0);
  };
  return a.k_code != kKvF32 && a.v_code != kKvF32 &&
         f16_aligned(a.k_code, a.k, a.k_row_bytes, a.hd_k) &&
         f16_aligned(a.v_code, a.v, a.v_row_bytes, a.hd_v) && hd > 32 && hd <= kMaxHeadDim &&
         a.n_tokens * a.group >= kMmaRows && kernel_arch() >= 80;
}

void launch_attention_mma(const AttnArgs& a, int64_t n_head_kv, int n_split, cudaStream_t stream) {
  const int hd = std::max(a.hd_k, a.hd_v);
  if (hd <= 64) {
    launch<64>(a, n_head_kv, n_split, stream);
  } else if (hd <= 128) {
    launch<128>(a, n_head_kv, n_split, stream);
  } else {
    launch<256>(a, n_head_kv, n_split, stream);
  }
}

}  // namespace moe::cuda
