// Causal GQA attention for prompt batches on tensor cores (attention_mma.cu): the f32 kernel of
// attention.cu computes every q·k and p·v with scalar FMAs from shared memory, which at depth (a
// chat's next turn over a 16k history) costs more than all the layers' matmuls. Only .cu files
// include this.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_args.cuh"

namespace moe::cuda {

constexpr int kMmaRows = 64;  // query rows (token, head of the KV head) per block

// Whether the tensor-core kernel serves this call: a device of compute capability 8.0 or newer
// (mma.sync m16n8k16), at least one block of query rows, head dims above 32, and no f32 cache side
// (an f32 cache asks for f32 arithmetic; the kernel rounds q, K, V and the probabilities to f16).
// f16 sides need 16-byte aligned rows and head offsets (else the f32 kernel runs).
bool attention_mma_serves(const AttnArgs& a);

// Launches it: grid (query-row blocks of kMmaRows, KV heads, n_split position slices), partials
// to a.part_acc / a.part_ml as attention.cu's merge kernel reads them when n_split > 1.
void launch_attention_mma(const AttnArgs& a, int64_t n_head_kv, int n_split, cudaStream_t stream);

}  // namespace moe::cuda
