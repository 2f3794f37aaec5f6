// Where a GPU forward's tokens enter and its logits leave: the token embeddings are decoded on the
// host (token_embd stays in RAM, as llama.cpp keeps it: big and read sparsely) and copied in; the
// final norm and the output head run in VRAM, a bounded chunk of rows at a time.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "coordinator/gpu/pinned_buffer.h"
#include "coordinator/gpu/vram_budget.h"
#include "experts/tensor_table.h"
#include "kernels/cuda/device_matrix.h"

namespace moe::gpu {

class TokenIoGpu {
 public:
  TokenIoGpu(VramBudget& budget, const gguf::GgufFile& f, int64_t n_embd, int64_t n_vocab,
             float rms_eps);

  // Staging for batches of up to n tokens (grow-only).
  void reserve(int64_t n_tokens);
  // x [n, n_embd] (device) = the embeddings of `tokens` (ids already checked); enqueued.
  void embed(std::span<const int32_t> tokens, float* x, cudaStream_t stream);
  // Host logits [n - first, n_vocab] of rows [first, n) of x; xn is device scratch of
  // (n - first) * n_embd floats. Enqueued: the caller synchronizes before reading them.
  void logits(const float* x, int64_t first, int64_t n, float* xn, float* logits,
              cudaStream_t stream);
  // logits() of rows [0, n) of x in two parts, so the first can be captured in a CUDA graph (a
  // copy to pageable host memory cannot): the final norm and the output head into device scratch
  // (xn: n * n_embd floats), then the copy of those logits to the host. n <= kHeadRows.
  static constexpr int64_t kHeadRows = 32;
  void head_rows(const float* x, float* xn, int64_t n, cudaStream_t stream);
  void copy_head_rows(float* logits, int64_t n, cudaStream_t stream);

 private:
  int64_t n_embd_, n_vocab_;
  float eps_;
  model::EmbeddingTensors emb_;
  VramBuffer norm_, head_buf_, d_logits_;
  cuda::DeviceMatrix head_{};
  PinnedBuffer h_x_;
};

}  // namespace moe::gpu
