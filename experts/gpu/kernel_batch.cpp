#include "experts/gpu/kernel_batch.h"

#include <string>

#include "common/error.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/expert_matmul.h"
#include "kernels/cuda/rmsnorm.h"

namespace moe::gpu {
namespace {

template <typename T>
T* mut(const void* p) {
  return static_cast<T*>(const_cast<void*>(p));
}
template <typename T>
const T* in(const void* p) {
  return static_cast<const T*>(p);
}

}  // namespace

void KernelBatch::grouped_gate_up_swiglu(GgmlType type, int64_t n_in, int64_t n_out,
                                         size_t row_bytes, const void* const* gate_ptrs,
                                         const void* const* up_ptrs, const int32_t* offsets,
                                         int32_t n_items, const int32_t* x_rows, const float* x,
                                         int64_t x_stride, float* h) {
  KernelCall c{.op = KernelOp::GroupedGateUpSwiglu, .type = static_cast<uint32_t>(type)};
  c.i[0] = n_in, c.i[1] = n_out, c.i[2] = static_cast<int64_t>(row_bytes), c.i[3] = n_items,
  c.i[4] = x_stride;
  c.p[0] = gate_ptrs, c.p[1] = up_ptrs, c.p[2] = offsets, c.p[3] = x_rows, c.p[4] = x, c.p[5] = h;
  calls_.push_back(c);
}

void KernelBatch::grouped_matmul(GgmlType type, int64_t n_in, int64_t n_out, size_t row_bytes,
                                 const void* const* w_ptrs, const int32_t* offsets,
                                 int32_t n_groups, const int32_t* x_rows, int64_t total_rows,
                                 int64_t max_rows_per_group, const float* x, int64_t x_stride,
                                 float* y) {
  KernelCall c{.op = KernelOp::GroupedMatmul, .type = static_cast<uint32_t>(type)};
  c.i[0] = n_in, c.i[1] = n_out, c.i[2] = static_cast<int64_t>(row_bytes), c.i[3] = n_groups,
  c.i[4] = total_rows, c.i[5] = max_rows_per_group;
  c.i[6] = x_stride;
  c.p[0] = w_ptrs, c.p[1] = offsets, c.p[2] = x_rows, c.p[3] = x, c.p[4] = y;
  calls_.push_back(c);
}

void KernelBatch::swiglu(const float* g, const float* u, float* h, int64_t n) {
  KernelCall c{.op = KernelOp::Swiglu};
  c.i[0] = n;
  c.p[0] = g, c.p[1] = u, c.p[2] = h;
  calls_.push_back(c);
}

void KernelBatch::combine_rows(const float* y, const int32_t* tok_offsets, const int32_t* rows,
                               const float* weights, int64_t n_tokens, int64_t n_embd,
                               bool accumulate, float* out) {
  KernelCall c{.op = KernelOp::CombineRows};
  c.i[0] = n_tokens, c.i[1] = n_embd, c.i[2] = accumulate ? 1 : 0;
  c.p[0] = y, c.p[1] = tok_offsets, c.p[2] = rows, c.p[3] = weights, c.p[4] = out;
  calls_.push_back(c);
}

void KernelBatch::combine_rmsnorm(const float* y, const float* weights, int64_t k, float* x,
                                  const float* w, float* out, int64_t n, float eps) {
  KernelCall c{.op = KernelOp::CombineRmsnorm};
  c.i[0] = k, c.i[1] = n;
  c.p[0] = y, c.p[1] = weights, c.p[2] = x, c.p[3] = w, c.p[4] = out;
  c.f[0] = eps;
  calls_.push_back(c);
}

void KernelBatch::swiglu_oai(const float* g, const float* u, float* h, int64_t n_rows, int64_t n_ff,
                             const int32_t* row_expert, const float* gate_bias,
                             const float* up_bias, int64_t n_expert, float alpha, float limit) {
  KernelCall c{.op = KernelOp::SwigluOai};
  c.i[0] = n_rows, c.i[1] = n_ff, c.i[2] = n_expert;
  c.p[0] = g, c.p[1] = u, c.p[2] = h, c.p[3] = row_expert, c.p[4] = gate_bias, c.p[5] = up_bias;
  c.f[0] = alpha, c.f[1] = limit;
  calls_.push_back(c);
}

void KernelBatch::add_expert_bias(float* y, int64_t n_rows, int64_t width,
                                  const int32_t* row_expert, const float* bias, int64_t n_expert) {
  KernelCall c{.op = KernelOp::AddExpertBias};
  c.i[0] = n_rows, c.i[1] = width, c.i[2] = n_expert;
  c.p[0] = y, c.p[1] = row_expert, c.p[2] = bias;
  calls_.push_back(c);
}

void KernelBatch::replay(cudaStream_t stream) const {
  for (const KernelCall& c : calls_) {
    const auto type = static_cast<GgmlType>(c.type);
    switch (c.op) {
      case KernelOp::GroupedGateUpSwiglu:
        cuda::grouped_gate_up_swiglu(
            type, c.i[0], c.i[1], static_cast<size_t>(c.i[2]), in<const void*>(c.p[0]),
            in<const void*>(c.p[1]), in<int32_t>(c.p[2]), static_cast<int32_t>(c.i[3]),
            in<int32_t>(c.p[3]), in<float>(c.p[4]), c.i[4], mut<float>(c.p[5]), stream);
        break;
      case KernelOp::GroupedMatmul:
        cuda::grouped_matmul(type, c.i[0], c.i[1], static_cast<size_t>(c.i[2]),
                             in<const void*>(c.p[0]), in<int32_t>(c.p[1]),
                             static_cast<int32_t>(c.i[3]), in<int32_t>(c.p[2]), c.i[4], c.i[5],
                             in<float>(c.p[3]), c.i[6], mut<float>(c.p[4]), stream);
        break;
      case KernelOp::Swiglu:
        cuda::swiglu(in<float>(c.p[0]), in<float>(c.p[1]), mut<float>(c.p[2]), c.i[0], stream);
        break;
      case KernelOp::CombineRows:
        cuda::combine_rows(in<float>(c.p[0]), in<int32_t>(c.p[1]), in<int32_t>(c.p[2]),
                           in<float>(c.p[3]), c.i[0], c.i[1], c.i[2] != 0, mut<float>(c.p[4]),
                           stream);
        break;
      case KernelOp::CombineRmsnorm:
        cuda::combine_rmsnorm(in<float>(c.p[0]), in<float>(c.p[1]), c.i[0], mut<float>(c.p[2]),
                              in<float>(c.p[3]), mut<float>(c.p[4]), c.i[1], c.f[0], stream);
        break;
      case KernelOp::SwigluOai:
        cuda::swiglu_oai(in<float>(c.p[0]), in<float>(c.p[1]), mut<float>(c.p[2]), c.i[0], c.i[1],
                         in<int32_t>(c.p[3]), in<float>(c.p[4]), in<float>(c.p[5]), c.i[2], c.f[0],
                         c.f[1], stream);
        break;
      case KernelOp::AddExpertBias:
        cuda::add_expert_bias(mut<float>(c.p[0]), c.i[0], c.i[1], in<int32_t>(c.p[1]),
                              in<float>(c.p[2]), c.i[2], stream);
        break;
    }
  }
}

KernelBatch KernelBatch::from(std::span<const KernelCall> calls) {
  KernelBatch b;
  for (const KernelCall& c : calls) {
    const auto op = static_cast<uint32_t>(c.op);
    if (op < static_cast<uint32_t>(KernelOp::GroupedGateUpSwiglu) ||
        op > static_cast<uint32_t>(KernelOp::AddExpertBias)) {
      throw Error("kernel batch: unknown kernel op " + std::to_string(op));
    }
    if (!ggml_type_info(c.type)) {
      throw Error("kernel batch: unknown weight type " + std::to_string(c.type));
    }
    b.calls_.push_back(c);
  }
  return b;
}

}  // namespace moe::gpu
