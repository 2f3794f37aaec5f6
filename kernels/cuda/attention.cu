// KV cache stores and causal GQA attention (flash-decoding style).
//
// Attention: a block owns one KV head and 8 queries (query = (token, query head of that KV head),
// one warp each), and walks a range of cache positions in tiles that are decoded to f32 in shared
// memory once for all 8 queries. Each warp keeps an online softmax (running max m, sum l,
// unnormalized output acc). When the (query block × KV head) grid is too small to fill the GPU
// (decode), the positions are split into ranges over grid.z and a merge kernel combines the
// partial (m, l, acc) of each query. Prompt batches on sm_80+ take the tensor-core kernel of
// attention_mma.cu instead, and decode steps (at most 8 query rows per KV head) the register
// kernel of attention_decode.cu; both share the splits and the merge. gpt-oss's AttentionMask:
// every kernel masks each row to its window and the splits start at the batch's first visible
// position (attention_args.cuh's split_first); a sink enters once, in the merge or in the
// single-slice epilogue (sink_norm).
#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_args.cuh"
#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant_device.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/kv_rows.cuh"
#include "kernels/cuda/launch_util.cuh"

namespace moe::cuda {
namespace {

constexpr int kAttnWarps = 8;  // queries per block of the f32 kernel

// ---- KV store -----------------------------------------------------------------------------------

// Grid: y = side (0: K, 1: V); x strides over that side's elements. One launch for both sides.
__global__ void kv_store_kernel(KvStoreSide k, KvStoreSide v, int64_t n_tokens, int64_t pos0_host,
                                const int32_t* device_pos0, int64_t n_ctx) {
  const int64_t pos0 = batch_pos0(device_pos0, pos0_host, n_tokens, n_ctx);
  if (pos0 < 0) return;
  kv_store_rows(blockIdx.y == 0 ? k : v, n_tokens, pos0);
}

// ---- attention ----------------------------------------------------------------------------------

// Rows p0 + warp + 8 rr (rr < RR) of one side of the cache, dims lane + 32 i of the head at
// element `off`, into registers; zeros past p_end (never read: rows there may be unwritten) and
// past hd.
template <int kCode, int RR, int DPL>
__device__ __forceinline__ void load_rows_t(const uint8_t* base, size_t row_bytes, int64_t ring,
                                            int64_t off, int hd, int64_t p0, int64_t p_end,
                                            int warp, int lane, float (&reg)[RR][DPL]) {
#pragma unroll
  for (int rr = 0; rr < RR; ++rr) {
    const int64_t pos = p0 + warp + kAttnWarps * rr;
    const bool valid = pos < p_end;
    const uint8_t* row = base + (valid ? kv_row(pos, ring) : 0) * static_cast<int64_t>(row_bytes);
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      reg[rr][i] = valid && d < hd ? kv_value<kCode>(row, off + d) : 0.0f;
    }
  }
}

// The cache type switch sits outside the unrolled loads (one uniform branch per tile).
template <int RR, int DPL>
__device__ __forceinline__ void load_rows(int code, const uint8_t* base, size_t row_bytes,
                                          int64_t ring, int64_t off, int hd, int64_t p0,
                                          int64_t p_end, int warp, int lane,
                                          float (&reg)[RR][DPL]) {
  if (code == kKvF32) {
    load_rows_t<kKvF32>(base, row_bytes, ring, off, hd, p0, p_end, warp, lane, reg);
  } else if (code == kKvF16) {
    load_rows_t<kKvF16>(base, row_bytes, ring, off, hd, p0, p_end, warp, lane, reg);
  } else if (code == kKvQ8_0) {
    load_rows_t<kKvQ8_0>(base, row_bytes, ring, off, hd, p0, p_end, warp, lane, reg);
  } else if (code == kKvQ4_0) {
    load_rows_t<kKvQ4_0>(base, row_bytes, ring, off, hd, p0, p_end, warp, lane, reg);
  } else if (code == kKvBF16) {
    load_rows_t<kKvBF16>(base, row_bytes, ring, off, hd, p0, p_end, warp, lane, reg);
  } else if (code == kKvQ4_1) {
    load_rows_t<kKvQ4_1>(base, row_bytes, ring, off, hd, p0, p_end, warp, lane, reg);
  } else if (code == kKvQ5_0) {
    load_rows_t<kKvQ5_0>(base, row_bytes, ring, off, hd, p0, p_end, warp, lane, reg);
  } else if (code == kKvIQ4_NL) {
    load_rows_t<kKvIQ4_NL>(base, row_bytes, ring, off, hd, p0, p_end, warp, lane, reg);
  } else {
    load_rows_t<kKvQ5_1>(base, row_bytes, ring, off, hd, p0, p_end, warp, lane, reg);
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, m));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, m);
  return v;
}

// DPL: head dims per lane (head_dim <= 32 * DPL). P: positions per tile; for P = 16 two lanes
// share a position's dot product (keeps shared memory under 48 KiB for head_dim 256).
// Grid: x = query blocks, y = KV head, z = position split.
// Two blocks per SM where the registers allow it without heavy spilling (the kernel is
// latency-bound: occupancy matters more than a few spilled values).
template <int DPL, int P>
__global__ void __launch_bounds__(kAttnWarps * 32, DPL >= 8 ? 1 : 2) attention_kernel(AttnArgs a) {
  constexpr int HD = 32 * DPL;
  constexpr int L = 32 / P;  // lanes per position in q·k
  // Row stride HD + 4: float4 reads stay aligned, and the 8 lanes of each quarter-warp phase
  // (8 different rows) hit 8 different 4-bank groups.
  __shared__ __align__(16) float ks[P][HD + 4];
  __shared__ __align__(16) float vs[P][HD];
  __shared__ __align__(16) float qs[kAttnWarps][HD];
  __shared__ __align__(16) float ps[kAttnWarps][P];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int hk = static_cast<int>(blockIdx.y);
  const int64_t n_q = a.n_tokens * a.group;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kAttnWarps;
  const int64_t qi = q0 + warp;
  const bool active = qi < n_q;
  const int64_t t = active ? qi / a.group : 0;
  const int h = hk * a.group + static_cast<int>(active ? qi % a.group : 0);
  // A refused device position reads nothing (p_end <= 0); the outputs are then meaningless but
  // every access stays in bounds.
  const int64_t pos0 = batch_pos0(a.device_pos0, a.pos0, a.n_tokens, a.n_ctx);
  const int64_t n_vis = pos0 + t + 1;  // causal: positions [first, pos0 + t]
  const int64_t first = first_visible(a.window, pos0 + t);
  const int64_t lo = split_first(a.window, pos0);
  const int64_t split_len = split_length(pos0 + a.n_tokens - lo, a.split_bound);
  // Positions any query of the block sees, cut to this split's range (empty for the tail slices
  // of a graph's fixed grid: their partials are m = -inf, l = 0, which the merge weighs 0). With
  // a window the block starts at its first token's first position: earlier tiles are not read.
  const int64_t t_last = (std::min(n_q, q0 + kAttnWarps) - 1) / a.group;
  const int64_t p_begin = lo + static_cast<int64_t>(blockIdx.z) * split_len;
  const int64_t p_start = std::max(p_begin, first_visible(a.window, pos0 + q0 / a.group));
  const int64_t p_end = std::min(p_begin + split_len, pos0 + t_last + 1);
  // q·k runs over whole float4s: q and the K rows are zero-padded to a multiple of 4.
  const int hd4_k = (a.hd_k + 3) / 4 * 4;

  if (active) {
    const float* qr = a.q + t * a.q_stride + static_cast<int64_t>(h) * a.hd_k;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      qs[warp][d] = d < a.hd_k ? qr[d] : 0.0f;
    }
  }
  float m = -INFINITY, l = 0.0f;
  float acc[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
  const int j = lane % P, part = lane / P;
  const int64_t k_off = static_cast<int64_t>(hk) * a.hd_k;
  const int64_t v_off = static_cast<int64_t>(hk) * a.hd_v;

  // Tile rows are staged in registers: the loads of the next tile are issued before the current
  // one is computed, so their latency overlaps the math (and no load waits behind a shared store
  // the compiler cannot prove unrelated). Warp w holds rows w, w + 8, ... of a tile.
  constexpr int RR = P / kAttnWarps;
  float kreg[RR][DPL], vreg[RR][DPL];
  const auto load_tile = [&](int64_t p0) {
    load_rows(a.k_code, a.k, a.k_row_bytes, a.ring, k_off, a.hd_k, p0, p_end, warp, lane, kreg);
    load_rows(a.v_code, a.v, a.v_row_bytes, a.ring, v_off, a.hd_v, p0, p_end, warp, lane, vreg);
  };
  if (p_start < p_end) load_tile(p_start);

  for (int64_t p0 = p_start; p0 < p_end; p0 += P) {
    __syncthreads();  // the previous tile is consumed (and qs is written)
#pragma unroll
    for (int rr = 0; rr < RR; ++rr) {
      const int jj = warp + kAttnWarps * rr;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        if (d < hd4_k) ks[jj][d] = kreg[rr][i];
        if (d < a.hd_v) vs[jj][d] = vreg[rr][i];
      }
    }
    __syncthreads();
    if (p0 + P < p_end) load_tile(p0 + P);
    if (!active) continue;
    const float4* q4 = reinterpret_cast<const float4*>(qs[warp]);
    const float4* k4 = reinterpret_cast<const float4*>(ks[j]);
    float s0 = 0.0f, s1 = 0.0f;  // two chains halve the FMA latency
#pragma unroll 4
    for (int c = part; c < hd4_k / 4; c += L) {
      const float4 qv = q4[c], kv = k4[c];
      s0 = fmaf(qv.x, kv.x, s0);
      s1 = fmaf(qv.y, kv.y, s1);
      s0 = fmaf(qv.z, kv.z, s0);
      s1 = fmaf(qv.w, kv.w, s1);
    }
    float s = s0 + s1;
    if constexpr (L == 2) s += __shfl_xor_sync(0xFFFFFFFFu, s, 16);
    const int64_t pos = p0 + j;
    s = (pos < p_end && pos < n_vis && pos >= first) ? s * a.scale : -INFINITY;
    const float m_new = fmaxf(m, warp_max(s));
    if (m_new == -INFINITY) continue;    // every position of this tile is masked for this query
    const float corr = expf(m - m_new);  // 0 on the first visible tile (m = -inf)
    const float p = expf(s - m_new);     // 0 for masked positions
    l = l * corr + warp_sum(part == 0 ? p : 0.0f);
    if (part == 0) ps[warp][j] = p;
    __syncwarp();
    const float4* p4 = reinterpret_cast<const float4*>(ps[warp]);
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      acc[i] *= corr;
      if (d < a.hd_v) {
#pragma unroll
        for (int c = 0; c < P / 4; ++c) {
          const float4 pv = p4[c];
          acc[i] = fmaf(pv.x, vs[4 * c][d], acc[i]);
          acc[i] = fmaf(pv.y, vs[4 * c + 1][d], acc[i]);
          acc[i] = fmaf(pv.z, vs[4 * c + 2][d], acc[i]);
          acc[i] = fmaf(pv.w, vs[4 * c + 3][d], acc[i]);
        }
      }
    }
    m = m_new;
  }
  const int64_t qidx = t * a.n_head + h;  // row of out / of the partials
  if (!active) return;
  if (gridDim.z == 1) {
    float* o = a.out + qidx * a.hd_v;
    const SinkNorm sn = a.sinks ? sink_norm(m, l, a.sinks[h]) : SinkNorm{};
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      if (d < a.hd_v) o[d] = a.sinks ? __fmul_rn(acc[i], sn.c) / sn.den : acc[i] / l;
    }
    return;
  }
  const int64_t pi = static_cast<int64_t>(blockIdx.z) * a.n_tokens * a.n_head + qidx;
  float* o = a.part_acc + pi * a.hd_v;
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    const int d = lane + 32 * i;
    if (d < a.hd_v) o[d] = acc[i];
  }
  if (lane == 0) {
    a.part_ml[2 * pi] = m;
    a.part_ml[2 * pi + 1] = l;
  }
}

// One block per query: out = sum_z acc_z e^(m_z - M) / sum_z l_z e^(m_z - M), M = max_z m_z
// (finite: every query sees its own position). With a sink s (AttentionMask), counted here once
// and in no slice: M = max(M, s) and e^(s - M) joins the denominator. A query's slices past its
// last non-empty one are not read (a graph's fixed grid's tail; with a window a prompt row's
// slices before its first position are empty too, but written: m = -inf, l = 0, acc = 0, weighed
// 0), and every sum's order depends only on the count read, so a graph's fixed grid of mostly
// empty slices merges to the same bits as an eager launch of just the slices needed, and costs
// no more.
// The max, the sum and the output's sum over slices are spread over the threads (a serial walk of
// 256 slices per thread cost ~20 us at 32k positions), and a query's dims over blocks of 32.
// (Merging in the last attention block to finish instead, behind a completion counter, was
// slower: every one of a graph's ~500 mostly empty blocks then pays a fence and an atomic.)
constexpr int kMergeThreads = 256;

// The block's reduction of one value per thread (max or sum), the same order for any input.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    const float o = __shfl_xor_sync(0xFFFFFFFFu, v, m);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  __syncthreads();  // scratch is free (an earlier reduction's readers are done)
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < kMergeThreads / 32; ++w) v = kMax ? fmaxf(v, scratch[w]) : v + scratch[w];
  return v;
}

__global__ void __launch_bounds__(kMergeThreads)
    attention_merge_kernel(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                           int n_split, int64_t n_q, int hd_v, const float* __restrict__ sinks,
                           int n_head, float* __restrict__ out) {
  __shared__ float sm[kMaxSplits], sl[kMaxSplits], scale[kMaxSplits];
  __shared__ float red[kMergeThreads];
  __shared__ float scratch[kMergeThreads / 32];
  __shared__ int n_used;
  const int64_t qidx = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) n_used = 0;
  __syncthreads();
  for (int z = tid; z < n_split; z += kMergeThreads) {
    const int64_t pi = z * n_q + qidx;
    sm[z] = part_ml[2 * pi];
    sl[z] = part_ml[2 * pi + 1];
    if (sl[z] > 0.0f) atomicMax(&n_used, z + 1);
  }
  __syncthreads();
  const int n = n_used;
  float v = -INFINITY;
  for (int z = tid; z < n; z += kMergeThreads) v = fmaxf(v, sm[z]);
  float mx = block_reduce<true>(v, scratch);
  const float sink = sinks ? sinks[qidx % n_head] : 0.0f;
  if (sinks) mx = fmaxf(mx, sink);
  v = 0.0f;
  for (int z = tid; z < n; z += kMergeThreads) {
    scale[z] = expf(sm[z] - mx);
    v += sl[z] * scale[z];
  }
  float sum = block_reduce<false>(v, scratch);       // its barriers publish scale[]
  if (sinks) sum = __fadd_rn(sum, expf(sink - mx));  // as sink_norm() for a single slice
  // Warp w sums slices w, w + 8, ... of dim d (this block's 32 dims), in two chains.
  const int warp = tid / 32, d = static_cast<int>(blockIdx.y) * 32 + tid % 32;
  constexpr int kWarps = kMergeThreads / 32;
  float o0 = 0.0f, o1 = 0.0f;
  if (d < hd_v) {
    int z = warp;
#pragma unroll 4
    for (; z + kWarps < n; z += 2 * kWarps) {
      o0 += part_acc[(z * n_q + qidx) * hd_v + d] * scale[z];
      o1 += part_acc[((z + kWarps) * n_q + qidx) * hd_v + d] * scale[z + kWarps];
    }
    if (z < n) o0 += part_acc[(z * n_q + qidx) * hd_v + d] * scale[z];
  }
  red[tid] = o0 + o1;
  __syncthreads();
  if (warp == 0 && d < hd_v) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o += red[w * 32 + tid];
    out[qidx * hd_v + d] = o / sum;
  }
}

// ---- host side ----------------------------------------------------------------------------------

void check_kv_side(GgmlType type, const void* base, size_t row_bytes, int64_t elems,
                   const char* what, const char* side) {
  const std::string where = std::string(what) + ": " + side + " cache";
  kv_code(type, what);
  if (!base) throw Error(where + " is null");
  const auto packed = elems > 0 ? ggml_row_bytes(type, static_cast<uint64_t>(elems)) : std::nullopt;
  if (!packed) {
    throw Error(where + ": " + std::to_string(elems) + " values per row do not form whole " +
                ggml_type_label(static_cast<uint32_t>(type)) + " blocks");
  }
  const size_t align = type == GgmlType::F32 ? 4 : 2;
  if (row_bytes < *packed || row_bytes % align != 0 ||
      reinterpret_cast<uintptr_t>(base) % align != 0) {
    throw Error(where + ": row_bytes " + std::to_string(row_bytes) + " or its address is invalid");
  }
}

void check_kv(const DeviceKvLayer& kv, const char* what) {
  check_kv_side(kv.k_type, kv.k, kv.k_row_bytes, kv.k_elems, what, "K");
  check_kv_side(kv.v_type, kv.v, kv.v_row_bytes, kv.v_elems, what, "V");
  if (kv.n_ctx < 1) throw Error(std::string(what) + ": n_ctx < 1");
  if (kv.ring < 0)
    throw Error(std::string(what) + ": ring of " + std::to_string(kv.ring) + " rows");
}

void check_positions(const DeviceKvLayer& kv, int64_t n_tokens, int64_t pos0, const char* what) {
  if (n_tokens < 0 || pos0 < 0 || pos0 + n_tokens > kv.n_ctx) {
    throw Error(std::string(what) + ": context length " + std::to_string(kv.n_ctx) +
                " exceeded (positions " + std::to_string(pos0) + " .. " +
                std::to_string(pos0 + n_tokens - 1) + ")");
  }
  if (kv.ring > 0 && n_tokens > kv.ring) {
    throw Error(std::string(what) + ": " + std::to_string(n_tokens) +
                " rows at once into a sliding-window ring of " + std::to_string(kv.ring));
  }
}

struct Plan {
  int split_bound = 1;  // split_length()'s bound
  int n_split = 1;      // grid.z
  size_t workspace = 0;
  size_t workspace_any_window = 0;  // enough for any AttentionMask::window
};

// Splits the positions only when the query blocks (rows_per_block query rows each) alone would
// leave most SMs idle, and never into ranges shorter than kMinSplitPositions. With a device
// position the grid takes the most slices any position could need (the kernel finds the length
// from the position it reads). With a window only the positions the batch sees are split
// (split_first()), so the same bound splits a window's few positions into fewer slices.
Plan plan_attention(int64_t n_tokens, int64_t pos0, int64_t n_head, int64_t n_head_kv,
                    int64_t head_dim_v, bool device_pos0, int64_t rows_per_block, int64_t window) {
  Plan plan;
  const int64_t group = n_head / n_head_kv;
  const int64_t base_blocks = (n_tokens * group + rows_per_block - 1) / rows_per_block * n_head_kv;
  const int64_t target = 4 * static_cast<int64_t>(sm_count());
  if (base_blocks < target) {
    plan.split_bound = static_cast<int>(
        std::clamp<int64_t>((target + base_blocks - 1) / base_blocks, 1, kMaxSplits));
  }
  // The slice count is not monotonic in the positions split (97 positions may take fewer slices
  // than 96), so the bound for any window is split_length()'s slice count before rounding, which
  // is: ceil(n / kMinSplitPositions) capped by the bound, monotonic, and >= the slices of any
  // shorter range.
  int any_window = plan.split_bound;
  if (device_pos0) {
    plan.n_split = plan.split_bound;
  } else {
    const int64_t lo = split_first(window, pos0);
    const int64_t n_kv = pos0 + n_tokens - lo;
    const int64_t len = split_length(n_kv, plan.split_bound);
    plan.n_split = static_cast<int>((n_kv + len - 1) / len);
    any_window = static_cast<int>(std::clamp<int64_t>(
        (pos0 + n_tokens + kMinSplitPositions - 1) / kMinSplitPositions, 1, plan.split_bound));
  }
  const auto bytes = [&](int n_split) -> size_t {
    if (n_split <= 1) return 0;
    const auto entries =
        static_cast<size_t>(n_split) * static_cast<size_t>(n_tokens) * static_cast<size_t>(n_head);
    return entries * (static_cast<size_t>(head_dim_v) + 2) * sizeof(float);
  };
  plan.workspace = bytes(plan.n_split);
  plan.workspace_any_window = bytes(std::max(plan.n_split, any_window));
  return plan;
}

void check_attention(const DeviceKvLayer& kv, const float* q, int64_t q_stride, int64_t n_tokens,
                     int64_t pos0, int64_t n_head, int64_t n_head_kv, int64_t head_dim_k,
                     int64_t head_dim_v, const float* out, const AttentionMask& mask) {
  const char* what = "attention";
  if (mask.window < 0) {
    throw Error("attention: window " + std::to_string(mask.window) + " < 0 (0 for none)");
  }
  check_kv(kv, what);
  check_positions(kv, n_tokens, pos0, what);
  // The batch's rows were stored first: the ring must still hold its first token's window.
  if (kv.ring > 0 && (mask.window < 1 || kv.ring < mask.window + n_tokens - 1)) {
    throw Error("attention: a ring of " + std::to_string(kv.ring) +
                " rows cannot hold a window of " + std::to_string(mask.window) +
                " positions for a batch of " + std::to_string(n_tokens));
  }
  if (n_head < 1 || n_head_kv < 1 || n_head % n_head_kv != 0) {
    throw Error("attention: " + std::to_string(n_head) + " query heads do not divide into " +
                std::to_string(n_head_kv) + " KV heads");
  }
  if (head_dim_k < 1 || head_dim_v < 1 || head_dim_k > kMaxHeadDim || head_dim_v > kMaxHeadDim) {
    throw Error("attention: head dims " + std::to_string(head_dim_k) + "/" +
                std::to_string(head_dim_v) + " outside [1, " + std::to_string(kMaxHeadDim) + "]");
  }
  if (kv.k_elems != n_head_kv * head_dim_k || kv.v_elems != n_head_kv * head_dim_v) {
    throw Error("attention: cache rows of " + std::to_string(kv.k_elems) + "/" +
                std::to_string(kv.v_elems) + " values do not match " + std::to_string(n_head_kv) +
                " KV heads of " + std::to_string(head_dim_k) + "/" + std::to_string(head_dim_v));
  }
  if (q_stride < n_head * head_dim_k) {
    throw Error("attention: q_stride " + std::to_string(q_stride) + " < n_head * head_dim_k");
  }
  if (n_tokens > 0 && (!q || !out)) throw Error("attention: null device pointer");
  if (n_head_kv > 65535 || n_tokens * n_head > 0x7FFFFFFF) {
    throw Error("attention: too many heads or tokens for one launch");
  }
}

template <int DPL, int P>
void launch_attention_kernel(const AttnArgs& a, int64_t n_head_kv, int n_split,
                             cudaStream_t stream) {
  const int64_t n_q = a.n_tokens * a.group;
  const dim3 grid(static_cast<unsigned>((n_q + kAttnWarps - 1) / kAttnWarps),
                  static_cast<unsigned>(n_head_kv), static_cast<unsigned>(n_split));
  attention_kernel<DPL, P><<<grid, kAttnWarps * 32, 0, stream>>>(a);
  MOE_CUDA_CHECK(cudaGetLastError());
}

AttnArgs make_args(const DeviceKvLayer& kv, const float* q, int64_t q_stride, int64_t n_tokens,
                   int64_t pos0, int64_t n_head, int64_t n_head_kv, int64_t head_dim_k,
                   int64_t head_dim_v, float scale, float* out, const int32_t* device_pos0,
                   const AttentionMask& mask) {
  AttnArgs a{};
  a.k = static_cast<const uint8_t*>(kv.k);
  a.v = static_cast<const uint8_t*>(kv.v);
  a.k_row_bytes = kv.k_row_bytes;
  a.v_row_bytes = kv.v_row_bytes;
  a.k_code = kv_code(kv.k_type, "attention");
  a.v_code = kv_code(kv.v_type, "attention");
  a.q = q;
  a.q_stride = q_stride;
  a.out = out;
  a.n_tokens = n_tokens;
  a.pos0 = pos0;
  a.device_pos0 = device_pos0;
  a.n_ctx = kv.n_ctx;
  a.ring = kv.ring;
  a.n_head = static_cast<int>(n_head);
  a.group = static_cast<int>(n_head / n_head_kv);
  a.hd_k = static_cast<int>(head_dim_k);
  a.hd_v = static_cast<int>(head_dim_v);
  a.scale = scale;
  a.window = mask.window;
  a.sinks = mask.sinks;
  return a;
}

}  // namespace

void kv_store(const DeviceKvLayer& kv, const float* k, const float* v, int64_t n_tokens,
              int64_t pos0, cudaStream_t stream, const int32_t* device_pos0, int64_t k_stride,
              int64_t v_stride) {
  check_kv(kv, "kv_store");
  check_positions(kv, n_tokens, pos0, "kv_store");
  if (n_tokens == 0) return;
  if (!k || !v) throw Error("kv_store: null device pointer");
  if (k_stride == 0) k_stride = kv.k_elems;
  if (v_stride == 0) v_stride = kv.v_elems;
  if (k_stride < kv.k_elems || v_stride < kv.v_elems) {
    throw Error("kv_store: a source row stride is shorter than the cache row (" +
                std::to_string(k_stride) + " < " + std::to_string(kv.k_elems) + " or " +
                std::to_string(v_stride) + " < " + std::to_string(kv.v_elems) + ")");
  }
  const KvStoreSide ks{static_cast<uint8_t*>(kv.k),
                       kv.k_row_bytes,
                       kv_code(kv.k_type, "kv_store"),
                       kv.k_elems,
                       k,
                       k_stride,
                       kv.ring};
  const KvStoreSide vs{static_cast<uint8_t*>(kv.v),
                       kv.v_row_bytes,
                       kv_code(kv.v_type, "kv_store"),
                       kv.v_elems,
                       v,
                       v_stride,
                       kv.ring};
  const dim3 grid(elem_blocks(n_tokens * std::max(kv.k_elems, kv.v_elems)), 2);
  kv_store_kernel<<<grid, kElemThreads, 0, stream>>>(ks, vs, n_tokens, pos0, device_pos0, kv.n_ctx);
  MOE_CUDA_CHECK(cudaGetLastError());
}

size_t attention_workspace_bytes(int64_t n_tokens, int64_t pos0, int64_t n_head, int64_t n_head_kv,
                                 int64_t head_dim_v, bool device_pos0) {
  if (n_tokens < 1 || pos0 < 0 || n_head < 1 || n_head_kv < 1 || n_head % n_head_kv != 0 ||
      head_dim_v < 1) {
    return 0;
  }
  // Enough for either kernel (which one runs depends on the cache and the device): the
  // tensor-core kernel's larger row blocks leave fewer blocks, so it may split more. And for any
  // window (its positions split differently).
  return std::max(
      plan_attention(n_tokens, pos0, n_head, n_head_kv, head_dim_v, device_pos0, kAttnWarps, 0)
          .workspace_any_window,
      plan_attention(n_tokens, pos0, n_head, n_head_kv, head_dim_v, device_pos0, kMmaRows, 0)
          .workspace_any_window);
}

bool attention_uses_tensor_cores(const DeviceKvLayer& kv, int64_t n_tokens, int64_t n_head,
                                 int64_t n_head_kv, int64_t head_dim_k, int64_t head_dim_v) {
  check_kv(kv, "attention");
  if (n_tokens < 1 || n_head < 1 || n_head_kv < 1 || n_head % n_head_kv != 0) return false;
  return attention_mma_serves(make_args(kv, nullptr, 0, n_tokens, 0, n_head, n_head_kv, head_dim_k,
                                        head_dim_v, 1.0f, nullptr, nullptr, {}));
}

void attention(const DeviceKvLayer& kv, const float* q, int64_t q_stride, int64_t n_tokens,
               int64_t pos0, int64_t n_head, int64_t n_head_kv, int64_t head_dim_k,
               int64_t head_dim_v, float scale, float* out, void* workspace, size_t workspace_bytes,
               cudaStream_t stream, const int32_t* device_pos0, const AttentionMask& mask) {
  check_attention(kv, q, q_stride, n_tokens, pos0, n_head, n_head_kv, head_dim_k, head_dim_v, out,
                  mask);
  if (n_tokens == 0) return;
  AttnArgs a = make_args(kv, q, q_stride, n_tokens, pos0, n_head, n_head_kv, head_dim_k, head_dim_v,
                         scale, out, device_pos0, mask);
  const bool mma = attention_mma_serves(a);
  const Plan plan =
      plan_attention(n_tokens, pos0, n_head, n_head_kv, head_dim_v, device_pos0 != nullptr,
                     mma ? kMmaRows : kAttnWarps, mask.window);
  if (plan.workspace > 0 && (!workspace || workspace_bytes < plan.workspace)) {
    throw Error("attention: workspace of " + std::to_string(workspace_bytes) + " bytes, " +
                std::to_string(plan.workspace) + " needed");
  }
  a.split_bound = plan.split_bound;
  if (plan.n_split > 1) {
    a.part_acc = static_cast<float*>(workspace);
    a.part_ml = a.part_acc + static_cast<size_t>(plan.n_split) * static_cast<size_t>(n_tokens) *
                                 static_cast<size_t>(n_head) * static_cast<size_t>(head_dim_v);
  }
  const int64_t hd = std::max(head_dim_k, head_dim_v);
  if (mma) {
    launch_attention_mma(a, n_head_kv, plan.n_split, stream);
  } else if (attention_decode_serves(a)) {
    launch_attention_decode(a, n_head_kv, plan.n_split, stream);
  } else if (hd <= 32) {
    launch_attention_kernel<1, 32>(a, n_head_kv, plan.n_split, stream);
  } else if (hd <= 64) {
    launch_attention_kernel<2, 32>(a, n_head_kv, plan.n_split, stream);
  } else if (hd <= 128) {
    launch_attention_kernel<4, 32>(a, n_head_kv, plan.n_split, stream);
  } else {
    launch_attention_kernel<8, 16>(a, n_head_kv, plan.n_split, stream);
  }
  if (plan.n_split > 1) {
    const int64_t n_q = n_tokens * n_head;
    const dim3 grid(static_cast<unsigned>(n_q), static_cast<unsigned>((a.hd_v + 31) / 32));
    attention_merge_kernel<<<grid, kMergeThreads, 0, stream>>>(a.part_acc, a.part_ml, plan.n_split,
                                                               n_q, a.hd_v, a.sinks, a.n_head, out);
    MOE_CUDA_CHECK(cudaGetLastError());
  }
}

void attention(const DeviceKvLayer& kv, const float* q, int64_t q_stride, int64_t n_tokens,
               int64_t pos0, int64_t n_head, int64_t n_head_kv, int64_t head_dim_k,
               int64_t head_dim_v, float scale, float* out, cudaStream_t stream,
               const AttentionMask& mask) {
  check_attention(kv, q, q_stride, n_tokens, pos0, n_head, n_head_kv, head_dim_k, head_dim_v, out,
                  mask);
  if (n_tokens == 0) return;
  const size_t bytes =
      attention_workspace_bytes(n_tokens, pos0, n_head, n_head_kv, head_dim_v, false);
  if (bytes == 0) {
    attention(kv, q, q_stride, n_tokens, pos0, n_head, n_head_kv, head_dim_k, head_dim_v, scale,
              out, nullptr, 0, stream, nullptr, mask);
    return;
  }
  // Stream-ordered scratch: no synchronization, and the pool makes repeated calls cheap.
  void* ws = nullptr;
  MOE_CUDA_CHECK(cudaMallocAsync(&ws, bytes, stream));
  try {
    attention(kv, q, q_stride, n_tokens, pos0, n_head, n_head_kv, head_dim_k, head_dim_v, scale,
              out, ws, bytes, stream, nullptr, mask);
  } catch (...) {
    (void)cudaFreeAsync(ws, stream);
    throw;
  }
  MOE_CUDA_CHECK(cudaFreeAsync(ws, stream));
}

}  // namespace moe::cuda
