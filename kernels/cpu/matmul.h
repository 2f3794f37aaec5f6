// y = W·x for a quantized weight matrix and a batch of activation rows: GEMV for decode (1-8 rows),
// cache-blocked GEMM for prefill.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/ggml_type.h"
#include "kernels/cpu/cpu_features.h"

namespace moe::cpu {

class ThreadPool;

// A 2-D weight in ggml layout: n_out rows of n_in elements, row o at data + o * row_bytes.
struct WeightMatrix {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;
  int64_t n_in = 0;
  int64_t n_out = 0;
  size_t row_bytes = 0;
};

// Builds a WeightMatrix, checking that the type is computable and n_in fits its block size.
WeightMatrix make_weight_matrix(GgmlType type, const void* data, int64_t n_in, int64_t n_out);

// Reusable buffer for converted activations, so steady-state calls allocate nothing.
class MatmulScratch {
 public:
  void* reserve(size_t bytes);

 private:
  std::vector<unsigned char> buf_;
};

// y[r * n_out + o] = sum_i W[o, i] * x[r * n_in + i] for r < n_rows (x, y row-major, float32).
// Activations are first converted to act_format_for(W.type), as llama.cpp does.
void matmul(const WeightMatrix& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool,
            MatmulScratch& scratch, Isa isa);

}  // namespace moe::cpu
