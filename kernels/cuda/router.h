// MoE router selection on the GPU, as kernels/cpu/router.cpp (without forced routing).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_matrix.h"

namespace moe::cuda {

// Per token (n_tokens rows of n_expert logits): probs = softmax(logits) (sum in double);
// ids = top k by probability, descending, ties to the lower id; weights = chosen probs / max(sum
// of chosen, 6.1035e-5). probs: [n_tokens, n_expert], ids and weights: [n_tokens, k].
// 1 <= k <= min(32, n_expert), n_expert <= 1024. Enqueued on `stream`. softmax_weight (gpt-oss,
// route_token_softmax_weight): ids = top k by logit (ties to the lower id), weights = softmax over
// the k chosen logits (exp in float, summed in double); probs as above.
void router_topk(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, float* probs,
                 int32_t* ids, float* weights, cudaStream_t stream, bool softmax_weight = false);

// Where router_decode writes, all device memory. table: 3 pointers per expert (gate, up, down; a
// null one makes the expert kernels write NaN). counter: one unsigned, zero before the first
// launch; every launch leaves it zero again (launches on one stream may share it).
struct RouterDecodeOut {
  float* logits;   // [n_expert]
  float* probs;    // [n_expert]
  int32_t* ids;    // [k]
  float* weights;  // [k]
  const void* const* table;
  const void** gate;  // [k]: table[3 ids[j]]
  const void** up;    // [k]: table[3 ids[j] + 1]
  const void** down;  // [k]: table[3 ids[j] + 2]
  unsigned* counter;
  // gpt-oss: the router's bias (device float[n_expert], added to each logit, logits holds the
  // sums; null: none) and router_topk's softmax_weight gating.
  const float* bias = nullptr;
  bool softmax_weight = false;
};

// One decoding token's router in one launch: logits = w · x (+ bias) (w: n_expert rows of n_in,
// f32, f16 or bf16; bit-identical to matmul() then add_bias()), then probs, ids and weights as
// router_topk, then the chosen experts' pointers. Enqueued on `stream`; moe::Error for bad
// arguments.
bool router_decode_supported(GgmlType t);
void router_decode(const DeviceMatrix& w, const float* x, int64_t k, const RouterDecodeOut& out,
                   cudaStream_t stream);

}  // namespace moe::cuda
