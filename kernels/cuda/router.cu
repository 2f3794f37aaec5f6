// MoE router, one warp per token: softmax (sum in double), k rounds of a warp arg-max (ties to
// the lower id), weights renormalized in the CPU's order. Same results as
// coordinator/model/router.cpp up to the last bits of expf.
#include <climits>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/router.h"

namespace moe::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxExperts = 1024;
constexpr int kMaxK = 32;

__global__ void __launch_bounds__(kWarps * 32)
    router_kernel(const float* __restrict__ logits, int64_t n_tokens, int n_expert, int k,
                  float* __restrict__ probs, int32_t* __restrict__ ids,
                  float* __restrict__ weights) {
  __shared__ float sp[kWarps][kMaxExperts];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (t >= n_tokens) return;  // only warp-level synchronization below
  const float* lg = logits + t * n_expert;
  float* p = sp[warp];

  float mx = -INFINITY;
  for (int e = lane; e < n_expert; e += 32) mx = fmaxf(mx, lg[e]);
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, m));
  double sum = 0;
  for (int e = lane; e < n_expert; e += 32) {
    p[e] = expf(lg[e] - mx);
    sum += p[e];
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, m);
  const float inv = static_cast<float>(1.0 / sum);
  for (int e = lane; e < n_expert; e += 32) {
    p[e] *= inv;
    probs[t * n_expert + e] = p[e];
  }
  __syncwarp();

  float mine = 0;  // lane j keeps the j-th chosen probability
  for (int j = 0; j < k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int e = lane; e < n_expert; e += 32) {
      if (p[e] > bv) {  // strict: the lowest id wins among this lane's equal values
        bv = p[e];
        bi = e;
      }
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
      const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, m);
      const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, m);
      if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == j) mine = bv;
    if (lane == 0) ids[t * k + j] = bi;
    __syncwarp();
    if (lane == 0) p[bi] = -INFINITY;  // chosen: never again
    __syncwarp();
  }
  // Sum in the CPU's order j = 0, 1, ...; every lane gets the same value.
  float wsum = 0;
  for (int j = 0; j < k; ++j) wsum += __shfl_sync(0xFFFFFFFFu, mine, j);
  const float denom = fmaxf(wsum, 6.103515625e-5f);
  if (lane < k) weights[t * k + lane] = mine / denom;
}

}  // namespace

void router_topk(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, float* probs,
                 int32_t* ids, float* weights, cudaStream_t stream) {
  if (n_expert < 1 || n_expert > kMaxExperts) {
    throw Error("router_topk: n_expert " + std::to_string(n_expert) + " outside [1, " +
                std::to_string(kMaxExperts) + "]");
  }
  if (k < 1 || k > kMaxK || k > n_expert) {
    throw Error("router_topk: k " + std::to_string(k) + " outside [1, min(32, n_expert)]");
  }
  if (n_tokens < 0) throw Error("router_topk: negative n_tokens");
  if (n_tokens == 0) return;
  if (!logits || !probs || !ids || !weights) throw Error("router_topk: null device pointer");
  const int64_t blocks = (n_tokens + kWarps - 1) / kWarps;
  if (blocks > 0x7FFFFFFF) throw Error("router_topk: too many tokens");
  router_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
      logits, n_tokens, static_cast<int>(n_expert), static_cast<int>(k), probs, ids, weights);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
