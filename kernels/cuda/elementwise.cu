// Element-wise kernels (SwiGLU and gpt-oss's SwiGLU-OAI, biases, residual add), the deterministic
// MoE combine and the embedding row gather.
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant_device.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/launch_util.cuh"

namespace moe::cuda {
namespace {

// As the CPU expert executor: g / (1 + exp(-g)) * u, accurate expf.
__global__ void swiglu_kernel(const float* g, const float* u, float* h, int64_t n) {
  for (int64_t i = grid_index(); i < n; i += grid_stride()) {
    const float gv = g[i];
    h[i] = gv / (1.0f + expf(-gv)) * u[i];
  }
}

__device__ __forceinline__ float nan_value() { return __int_as_float(0x7FC00000); }

// Bias of row r's expert, or null with *bad set when the id is out of range.
__device__ __forceinline__ const float* expert_row(const float* bias, const int32_t* row_expert,
                                                   int64_t r, int64_t width, int64_t n_expert,
                                                   bool* bad) {
  if (!bias) return nullptr;
  const int64_t e = row_expert[r];
  if (e < 0 || e >= n_expert) {
    *bad = true;
    return nullptr;
  }
  return bias + e * width;
}

__global__ void swiglu_oai_kernel(const float* g, const float* u, float* h, int64_t n_rows,
                                  int64_t n_ff, const int32_t* __restrict__ row_expert,
                                  const float* __restrict__ gate_bias,
                                  const float* __restrict__ up_bias, int64_t n_expert, float alpha,
                                  float limit) {
  for (int64_t i = grid_index(); i < n_rows * n_ff; i += grid_stride()) {
    const int64_t r = i / n_ff, c = i % n_ff;
    bool bad = false;
    const float* gb = expert_row(gate_bias, row_expert, r, n_ff, n_expert, &bad);
    const float* ub = expert_row(up_bias, row_expert, r, n_ff, n_expert, &bad);
    const float gv = gb ? g[i] + gb[c] : g[i];
    const float uv = ub ? u[i] + ub[c] : u[i];
    const float x = fminf(gv, limit);
    const float y = fminf(fmaxf(uv, -limit), limit);
    h[i] = bad ? nan_value() : x / (1.0f + expf(alpha * (-x))) * (y + 1.0f);
  }
}

__global__ void add_bias_kernel(float* y, int64_t n_rows, int64_t width, int64_t row_stride,
                                const float* __restrict__ bias) {
  for (int64_t i = grid_index(); i < n_rows * width; i += grid_stride()) {
    const int64_t r = i / width, c = i % width;
    y[r * row_stride + c] += bias[c];
  }
}

__global__ void add_expert_bias_kernel(float* y, int64_t n_rows, int64_t width,
                                       const int32_t* __restrict__ row_expert,
                                       const float* __restrict__ bias, int64_t n_expert) {
  for (int64_t i = grid_index(); i < n_rows * width; i += grid_stride()) {
    const int64_t r = i / width, c = i % width;
    bool bad = false;
    const float* b = expert_row(bias, row_expert, r, width, n_expert, &bad);
    y[i] = bad ? nan_value() : y[i] + b[c];
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = grid_index(); i < n; i += grid_stride()) x[i] += y[i];
}

// One thread per output element; products and sums rounded separately (no FMA), so the result
// is exactly the CPU's `o += w * y` loop in the same order.
__global__ void combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ tok_offsets,
                               const int32_t* __restrict__ rows, const float* __restrict__ weights,
                               int64_t n_tokens, int64_t n_embd, bool accumulate, float* out) {
  const int64_t total = n_tokens * n_embd;
  for (int64_t i = grid_index(); i < total; i += grid_stride()) {
    const int64_t t = i / n_embd, c = i % n_embd;
    float s = 0.0f;
    for (int32_t k = tok_offsets[t]; k < tok_offsets[t + 1]; ++k) {
      s = __fadd_rn(s, __fmul_rn(weights[k], y[static_cast<int64_t>(rows[k]) * n_embd + c]));
    }
    out[i] = accumulate ? out[i] + s : s;
  }
}

template <class Dec>
__global__ void get_rows_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_in,
                                int64_t n_out, const int32_t* __restrict__ ids, int64_t n,
                                float* __restrict__ out) {
  const int64_t units = n_in / Dec::kPer;
  for (int64_t i = grid_index(); i < n * units; i += grid_stride()) {
    const int64_t t = i / units, u = i % units;
    const int64_t id = ids[t];
    float v[Dec::kPer];
    if (id >= 0 && id < n_out) {
      Dec::decode(w + id * static_cast<int64_t>(row_bytes), u, v);
    } else {
#pragma unroll
      for (int k = 0; k < Dec::kPer; ++k) v[k] = __int_as_float(0x7FC00000);  // quiet NaN
    }
    float* o = out + t * n_in + u * Dec::kPer;
#pragma unroll
    for (int k = 0; k < Dec::kPer; ++k) o[k] = v[k];
  }
}

void check_n(int64_t n, const char* what) {
  if (n < 0) throw Error(std::string(what) + ": negative element count " + std::to_string(n));
}

}  // namespace

void swiglu(const float* g, const float* u, float* h, int64_t n, cudaStream_t stream) {
  check_n(n, "swiglu");
  if (n == 0) return;
  if (!g || !u || !h) throw Error("swiglu: null device pointer");
  swiglu_kernel<<<elem_blocks(n), kElemThreads, 0, stream>>>(g, u, h, n);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void swiglu_oai(const float* g, const float* u, float* h, int64_t n_rows, int64_t n_ff,
                const int32_t* row_expert, const float* gate_bias, const float* up_bias,
                int64_t n_expert, float alpha, float limit, cudaStream_t stream) {
  if (n_rows < 0 || n_ff < 0) throw Error("swiglu_oai: negative size");
  if (n_rows == 0 || n_ff == 0) return;
  if (!g || !u || !h) throw Error("swiglu_oai: null device pointer");
  if ((gate_bias || up_bias) && (!row_expert || n_expert < 1)) {
    throw Error("swiglu_oai: expert biases need the rows' experts");
  }
  swiglu_oai_kernel<<<elem_blocks(n_rows * n_ff), kElemThreads, 0, stream>>>(
      g, u, h, n_rows, n_ff, row_expert, gate_bias, up_bias, n_expert, alpha, limit);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void add_bias(float* y, int64_t n_rows, int64_t width, int64_t row_stride, const float* bias,
              cudaStream_t stream) {
  if (n_rows < 0 || width < 0 || row_stride < width) {
    throw Error("add_bias: bad shape (rows " + std::to_string(n_rows) + ", width " +
                std::to_string(width) + ", stride " + std::to_string(row_stride) + ")");
  }
  if (n_rows == 0 || width == 0) return;
  if (!y || !bias) throw Error("add_bias: null device pointer");
  add_bias_kernel<<<elem_blocks(n_rows * width), kElemThreads, 0, stream>>>(y, n_rows, width,
                                                                            row_stride, bias);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void add_expert_bias(float* y, int64_t n_rows, int64_t width, const int32_t* row_expert,
                     const float* bias, int64_t n_expert, cudaStream_t stream) {
  if (n_rows < 0 || width < 0) throw Error("add_expert_bias: negative size");
  if (n_rows == 0 || width == 0) return;
  if (!y || !row_expert || !bias) throw Error("add_expert_bias: null device pointer");
  if (n_expert < 1) throw Error("add_expert_bias: no experts");
  add_expert_bias_kernel<<<elem_blocks(n_rows * width), kElemThreads, 0, stream>>>(
      y, n_rows, width, row_expert, bias, n_expert);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  check_n(n, "add_inplace");
  if (n == 0) return;
  if (!x || !y) throw Error("add_inplace: null device pointer");
  add_kernel<<<elem_blocks(n), kElemThreads, 0, stream>>>(x, y, n);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void combine_rows(const float* y, const int32_t* tok_offsets, const int32_t* rows,
                  const float* weights, int64_t n_tokens, int64_t n_embd, bool accumulate,
                  float* out, cudaStream_t stream) {
  if (n_tokens < 0 || n_embd < 0) throw Error("combine_rows: negative size");
  if (n_tokens == 0 || n_embd == 0) return;
  if (!y || !tok_offsets || !rows || !weights || !out) {
    throw Error("combine_rows: null device pointer");
  }
  const int64_t total = n_tokens * n_embd;
  combine_kernel<<<elem_blocks(total), kElemThreads, 0, stream>>>(
      y, tok_offsets, rows, weights, n_tokens, n_embd, accumulate, out);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void get_rows(const DeviceMatrix& w, const int32_t* ids, int64_t n, float* out,
              cudaStream_t stream) {
  check_device_matrix(w, "get_rows");
  check_n(n, "get_rows");
  if (n == 0) return;
  if (!ids || !out) throw Error("get_rows: null device pointer");
  dq::dispatch(w.type, "get_rows", [&](auto dec) {
    using Dec = decltype(dec);
    const int64_t work = n * (w.n_in / Dec::kPer);
    get_rows_kernel<Dec><<<elem_blocks(work), kElemThreads, 0, stream>>>(
        static_cast<const uint8_t*>(w.data), w.row_bytes, w.n_in, w.n_out, ids, n, out);
    MOE_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace moe::cuda
