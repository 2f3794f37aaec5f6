// MoE router, one warp per token: softmax (sum in double), k rounds of a warp arg-max (ties to
// the lower id), weights renormalized in the CPU's order. Same results as
// kernels/cpu/router.cpp up to the last bits of expf. The decode router fuses the logits'
// GEMV, this selection and the gathering of the chosen experts' pointers into one launch: three
// dependent launches of 1 block (or 128) cost ~8 µs a layer in a decode step, mostly latency.
#include <climits>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/matmul_kernels.cuh"
#include "kernels/cuda/router.h"

namespace moe::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxExperts = 1024;
constexpr int kMaxK = 32;

__device__ __forceinline__ unsigned warp_max(unsigned v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(0xFFFFFFFFu, v);
#else
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, m));
  return v;
#endif
}

__device__ __forceinline__ int warp_min(int v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_min_sync(0xFFFFFFFFu, v);
#else
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = min(v, __shfl_xor_sync(0xFFFFFFFFu, v, m));
  return v;
#endif
}

// The order key of a selection candidate: larger key, better candidate; 0 never chosen (NaN, or
// marked chosen). By probability (non-negative): its bits + 1. By logit (softmax_weight, any
// sign): the bits mapped to an unsigned order (negative values flipped), + 1.
__device__ __forceinline__ unsigned order_key(float v, bool by_logit) {
  if (v != v) return 0u;
  if (!by_logit) return v >= 0.0f ? __float_as_uint(fabsf(v)) + 1u : 0u;
  const unsigned u = __float_as_uint(v);
  return ((u & 0x80000000u) ? ~u : (u | 0x80000000u)) + 1u;  // at most 0xFF800001 (+inf)
}

__device__ __forceinline__ float key_value(unsigned key, bool by_logit) {
  const unsigned k = key - 1u;
  if (!by_logit) return __uint_as_float(k);
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// One token's routing by one warp: lg = its n_expert logits (read through L2: in the decode
// router other blocks wrote them), p = n_expert floats of shared scratch. Returns the j-th chosen
// id to lane j (j < k), -1 when there is none (NaN logits). softmax_weight (gpt-oss): the top k
// by logit, weights = softmax over the chosen logits (route_token_softmax_weight); probs is the
// softmax over all logits either way.
__device__ int route_token_warp(const float* lg, int n_expert, int k, bool softmax_weight, float* p,
                                float* __restrict__ probs, int32_t* __restrict__ ids,
                                float* __restrict__ weights) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  float mx = -INFINITY;
  for (int e = lane; e < n_expert; e += 32) mx = fmaxf(mx, __ldcg(lg + e));
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, m));
  double sum = 0;
  for (int e = lane; e < n_expert; e += 32) {
    p[e] = expf(__ldcg(lg + e) - mx);
    sum += p[e];
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, m);
  const float inv = static_cast<float>(1.0 / sum);
  for (int e = lane; e < n_expert; e += 32) {
    p[e] *= inv;
    probs[e] = p[e];
    // Selected on the logits themselves: exp can round two close logits to one probability.
    if (softmax_weight) p[e] = __ldcg(lg + e);
  }
  __syncwarp();

  // k rounds of a warp arg-max over order keys: a probability's bits + 1 (non-negative floats
  // order as their bits), 0 for a chosen one (and NaN). A lane's candidate is its lowest id with
  // its largest key; the warp takes the largest key, then the lowest id holding it, so ties go
  // to the lower id as on the CPU. Two warp reductions a round (one instruction each on sm_80+)
  // instead of a chain of value-and-index shuffles.
  float mine = 0;  // lane j keeps the j-th chosen probability and id
  int mine_id = -1;
  for (int j = 0; j < k; ++j) {
    unsigned best = 0;
    int best_e = INT_MAX;
    for (int e = lane; e < n_expert; e += 32) {
      const unsigned key = order_key(p[e], softmax_weight);
      if (key > best) {  // strict: e ascends, so the lane keeps its lowest id of a key
        best = key;
        best_e = e;
      }
    }
    const unsigned top = warp_max(best);
    const int bi = top == 0 ? -1 : warp_min(best == top ? best_e : INT_MAX);
    if (lane == j) {
      mine = top == 0 ? 0.0f : key_value(top, softmax_weight);
      mine_id = bi;
    }
    if (lane == 0) ids[j] = bi;
    // Chosen (key 0 from now on): only its owner lane reads it again.
    if (bi >= 0 && bi % 32 == lane) p[bi] = __int_as_float(0x7FC00000);
  }
  if (softmax_weight) {
    // exp(l_j - max) in float, summed in double in the order j = 0, 1, ..., as the CPU does.
    float wmax = -INFINITY;
    for (int j = 0; j < k; ++j) wmax = fmaxf(wmax, __shfl_sync(0xFFFFFFFFu, mine, j));
    const float w = lane < k ? expf(mine - wmax) : 0.0f;
    double wsum = 0;
    for (int j = 0; j < k; ++j) wsum += static_cast<double>(__shfl_sync(0xFFFFFFFFu, w, j));
    const float winv = static_cast<float>(1.0 / wsum);
    if (lane < k) weights[lane] = w * winv;
    return mine_id;
  }
  // Sum in the CPU's order j = 0, 1, ...; every lane gets the same value.
  float wsum = 0;
  for (int j = 0; j < k; ++j) wsum += __shfl_sync(0xFFFFFFFFu, mine, j);
  const float denom = fmaxf(wsum, 6.103515625e-5f);
  if (lane < k) weights[lane] = mine / denom;
  return mine_id;
}

__global__ void __launch_bounds__(kWarps * 32)
    router_kernel(const float* __restrict__ logits, int64_t n_tokens, int n_expert, int k,
                  bool softmax_weight, float* __restrict__ probs, int32_t* __restrict__ ids,
                  float* __restrict__ weights) {
  __shared__ float sp[kWarps][kMaxExperts];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (t >= n_tokens) return;  // only warp-level synchronization below
  (void)route_token_warp(logits + t * n_expert, n_expert, k, softmax_weight, sp[warp],
                         probs + t * n_expert, ids + t * k, weights + t * k);
}

struct RouterDecodeArgs {
  const uint8_t* w;
  size_t row_bytes;
  int64_t n_in;
  int n_expert, k;
  bool softmax_weight;
  const float* bias;
  const float* x;
  float *logits, *probs, *weights;
  int32_t* ids;
  const void* const* table;
  const void **gate, **up, **down;
  unsigned* counter;
};

// Grid: one block per expert row. Each block writes its logit; the last block to finish (a
// device counter that atomicInc wraps back to 0, so the next launch finds it zero) routes.
template <class Dec>
__global__ void __launch_bounds__(detail::kRowThreads) router_decode_kernel(RouterDecodeArgs a) {
  __shared__ float red[detail::kRowThreads / 32];
  __shared__ float sp[kMaxExperts];
  __shared__ bool last;
  const auto o = static_cast<int64_t>(blockIdx.x);
  const float logit =
      detail::float_row_dot<Dec>(a.w + o * static_cast<int64_t>(a.row_bytes), a.x, a.n_in, red);
  if (threadIdx.x == 0) {
    a.logits[o] = a.bias ? logit + a.bias[o] : logit;
    __threadfence();  // the logit is visible before this block counts itself done
    last = atomicInc(a.counter, gridDim.x - 1) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x >= 32) return;
  __threadfence();
  const int e =
      route_token_warp(a.logits, a.n_expert, a.k, a.softmax_weight, sp, a.probs, a.ids, a.weights);
  const int lane = static_cast<int>(threadIdx.x);
  if (lane < a.k) {
    // No id (NaN logits) gives null pointers: the expert kernels then write NaN, never fault.
    const bool ok = e >= 0 && e < a.n_expert;
    a.gate[lane] = ok ? a.table[3 * e] : nullptr;
    a.up[lane] = ok ? a.table[3 * e + 1] : nullptr;
    a.down[lane] = ok ? a.table[3 * e + 2] : nullptr;
  }
}

void check_router_shape(int64_t n_expert, int64_t k, const char* what) {
  if (n_expert < 1 || n_expert > kMaxExperts) {
    throw Error(std::string(what) + ": n_expert " + std::to_string(n_expert) + " outside [1, " +
                std::to_string(kMaxExperts) + "]");
  }
  if (k < 1 || k > kMaxK || k > n_expert) {
    throw Error(std::string(what) + ": k " + std::to_string(k) + " outside [1, min(32, n_expert)]");
  }
}

}  // namespace

void router_topk(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, float* probs,
                 int32_t* ids, float* weights, cudaStream_t stream, bool softmax_weight) {
  check_router_shape(n_expert, k, "router_topk");
  if (n_tokens < 0) throw Error("router_topk: negative n_tokens");
  if (n_tokens == 0) return;
  if (!logits || !probs || !ids || !weights) throw Error("router_topk: null device pointer");
  const int64_t blocks = (n_tokens + kWarps - 1) / kWarps;
  if (blocks > 0x7FFFFFFF) throw Error("router_topk: too many tokens");
  router_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
      logits, n_tokens, static_cast<int>(n_expert), static_cast<int>(k), softmax_weight, probs, ids,
      weights);
  MOE_CUDA_CHECK(cudaGetLastError());
}

bool router_decode_supported(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

void router_decode(const DeviceMatrix& w, const float* x, int64_t k, const RouterDecodeOut& out,
                   cudaStream_t stream) {
  check_device_matrix(w, "router_decode weights");
  if (!router_decode_supported(w.type)) {
    throw Error("router_decode: weight type " + ggml_type_label(static_cast<uint32_t>(w.type)) +
                " is not f32, f16 or bf16");
  }
  check_router_shape(w.n_out, k, "router_decode");
  if (!x || !out.logits || !out.probs || !out.ids || !out.weights || !out.table || !out.gate ||
      !out.up || !out.down || !out.counter) {
    throw Error("router_decode: null device pointer");
  }
  RouterDecodeArgs a{};
  a.w = static_cast<const uint8_t*>(w.data);
  a.row_bytes = w.row_bytes;
  a.n_in = w.n_in;
  a.n_expert = static_cast<int>(w.n_out);
  a.k = static_cast<int>(k);
  a.softmax_weight = out.softmax_weight;
  a.bias = out.bias;
  a.x = x;
  a.logits = out.logits;
  a.probs = out.probs;
  a.weights = out.weights;
  a.ids = out.ids;
  a.table = out.table;
  a.gate = out.gate;
  a.up = out.up;
  a.down = out.down;
  a.counter = out.counter;
  const auto blocks = static_cast<unsigned>(w.n_out);
  if (w.type == GgmlType::F32) {
    router_decode_kernel<dq::F32><<<blocks, detail::kRowThreads, 0, stream>>>(a);
  } else if (w.type == GgmlType::F16) {
    router_decode_kernel<dq::F16><<<blocks, detail::kRowThreads, 0, stream>>>(a);
  } else {
    router_decode_kernel<dq::BF16><<<blocks, detail::kRowThreads, 0, stream>>>(a);
  }
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
