#include "coordinator/gpu/token_io_gpu.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "coordinator/gpu/gpu_upload.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"

namespace moe::gpu {
namespace {

// Rows of logits computed per output-head call: bounds the logits scratch (rows x n_vocab).
constexpr int64_t kLogitRows = TokenIoGpu::kHeadRows;

}  // namespace

TokenIoGpu::TokenIoGpu(VramBudget& budget, const gguf::GgufFile& f, int64_t n_embd, int64_t n_vocab,
                       float rms_eps)
    : n_embd_(n_embd), n_vocab_(n_vocab), eps_(rms_eps) {
  emb_ = model::require_embedding_tensors(f, n_embd, n_vocab);
  norm_ = upload_vector(budget, *emb_.output_norm);
  head_ = upload_matrix(budget, *emb_.output, head_buf_, VramUse::Weights);
  grow_scratch(budget, d_logits_, static_cast<size_t>(kLogitRows * n_vocab), "scratch logits");
}

void TokenIoGpu::reserve(int64_t n) { h_x_.reserve(static_cast<size_t>(n * n_embd_) * 4); }

void TokenIoGpu::embed(std::span<const int32_t> tokens, float* x, cudaStream_t stream) {
  const auto n = static_cast<int64_t>(tokens.size());
  reserve(n);
  float* hx = h_x_.get<float>();
  emb_.embed(tokens, hx);
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(x, hx, static_cast<size_t>(n * n_embd_) * 4, cudaMemcpyHostToDevice, stream));
}

void TokenIoGpu::logits(const float* x, int64_t first, int64_t n, float* xn, float* logits,
                        cudaStream_t stream) {
  const int64_t rows = n - first;
  cuda::rmsnorm(x + first * n_embd_, norm_.as<float>(), xn, rows, n_embd_, eps_, stream);
  for (int64_t r = 0; r < rows; r += kLogitRows) {
    const int64_t m = std::min(kLogitRows, rows - r);
    cuda::matmul(head_, xn + r * n_embd_, m, d_logits_.as<float>(), stream);
    MOE_CUDA_CHECK(cudaMemcpyAsync(logits + r * n_vocab_, d_logits_.get(),
                                   static_cast<size_t>(m * n_vocab_) * 4, cudaMemcpyDeviceToHost,
                                   stream));
  }
}

void TokenIoGpu::head_rows(const float* x, float* xn, int64_t n, cudaStream_t stream) {
  if (n < 1 || n > kHeadRows) throw Error("head_rows: " + std::to_string(n) + " rows");
  cuda::rmsnorm(x, norm_.as<float>(), xn, n, n_embd_, eps_, stream);
  cuda::matmul(head_, xn, n, d_logits_.as<float>(), stream);
}

void TokenIoGpu::copy_head_rows(float* logits, int64_t n, cudaStream_t stream) {
  if (n < 1 || n > kHeadRows) throw Error("copy_head_rows: " + std::to_string(n) + " rows");
  MOE_CUDA_CHECK(cudaMemcpyAsync(logits, d_logits_.get(), static_cast<size_t>(n * n_vocab_) * 4,
                                 cudaMemcpyDeviceToHost, stream));
}

}  // namespace moe::gpu
