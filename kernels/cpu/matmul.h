// y = W·x for a quantized weight matrix and a batch of activation rows: GEMV for decode (1-8 rows),
// cache-blocked GEMM for prefill.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/ggml_type.h"
#include "kernels/cpu/act_quant.h"
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

// One product of a batch for matmul_batch: y = W·x for n_rows rows.
struct MatmulJob {
  WeightMatrix w;
  const float* x = nullptr;
  int64_t n_rows = 0;
  float* y = nullptr;
};

// Reusable buffers for converted activations and batch tasks, so steady-state calls allocate
// nothing.
class MatmulScratch {
 public:
  void* reserve(size_t bytes);

 private:
  friend void matmul_batch(std::span<const MatmulJob> jobs, ThreadPool& pool,
                           MatmulScratch& scratch, Isa isa);
  struct BatchTask {
    size_t job = 0;
    int64_t o_begin = 0, o_end = 0;
    size_t act_offset = 0;
  };
  // A distinct activation input of a batch and where its converted rows are in buf_.
  struct ActInput {
    const float* x = nullptr;
    int64_t n_rows = 0, n_in = 0;
    ActFormat fmt = ActFormat::F32;
    size_t offset = 0;
  };
  std::vector<unsigned char> buf_;
  std::vector<BatchTask> tasks_;
  std::vector<ActInput> inputs_;
  std::vector<size_t> input_of_;
  std::vector<std::pair<size_t, int64_t>> act_rows_;
};

// y[r * n_out + o] = sum_i W[o, i] * x[r * n_in + i] for r < n_rows (x, y row-major, float32).
// Activations are first converted to act_format_for(W.type), as llama.cpp does.
void matmul(const WeightMatrix& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool,
            MatmulScratch& scratch, Isa isa);

// Several independent products in one dispatch of the pool: a decode step's experts are many
// small GEMVs, and a prefill's CPU share many expert matrices too small to fill the pool one at a
// time; one wake-up of every thread per matrix cost more than the products. Jobs reading the same
// x share its conversion. Each job's result is bit-identical to matmul() on it.
void matmul_batch(std::span<const MatmulJob> jobs, ThreadPool& pool, MatmulScratch& scratch,
                  Isa isa);

}  // namespace moe::cpu
