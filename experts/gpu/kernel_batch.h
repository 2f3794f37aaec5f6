// The routed-expert kernel launches of one MoE layer step, recorded as plain data so that they
// can run on another CUDA context: in the coordinator's process they are replayed at once on its
// stream; with a GPU worker process they travel to it over a socket and run on its stream. The
// pointers they carry are valid in both processes because every VRAM allocation is mapped at the
// same address in both (shared_vram.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "common/ggml_type.h"

namespace moe::gpu {

enum class KernelOp : uint32_t {
  GroupedGateUpSwiglu = 1,
  GroupedMatmul,
  Swiglu,
  CombineRows,
  CombineRmsnorm,
  SwigluOai,
  AddExpertBias
};

// One launch; which fields mean what is per op (see KernelBatch's recorders).
struct KernelCall {
  KernelOp op{};
  uint32_t type = 0;      // GgmlType of the weights
  int64_t i[8] = {};      // sizes and counts
  const void* p[8] = {};  // device pointers
  float f[2] = {};
};
static_assert(std::is_trivially_copyable_v<KernelCall>);

class KernelBatch {
 public:
  // The kernels/cuda functions of the same names, with the same arguments (stream aside).
  void grouped_gate_up_swiglu(GgmlType type, int64_t n_in, int64_t n_out, size_t row_bytes,
                              const void* const* gate_ptrs, const void* const* up_ptrs,
                              const int32_t* offsets, int32_t n_items, const int32_t* x_rows,
                              const float* x, int64_t x_stride, float* h);
  void grouped_matmul(GgmlType type, int64_t n_in, int64_t n_out, size_t row_bytes,
                      const void* const* w_ptrs, const int32_t* offsets, int32_t n_groups,
                      const int32_t* x_rows, int64_t total_rows, int64_t max_rows_per_group,
                      const float* x, int64_t x_stride, float* y);
  void swiglu(const float* g, const float* u, float* h, int64_t n);
  void combine_rows(const float* y, const int32_t* tok_offsets, const int32_t* rows,
                    const float* weights, int64_t n_tokens, int64_t n_embd, bool accumulate,
                    float* out);
  void combine_rmsnorm(const float* y, const float* weights, int64_t k, float* x, const float* w,
                       float* out, int64_t n, float eps);
  void swiglu_oai(const float* g, const float* u, float* h, int64_t n_rows, int64_t n_ff,
                  const int32_t* row_expert, const float* gate_bias, const float* up_bias,
                  int64_t n_expert, float alpha, float limit);
  void add_expert_bias(float* y, int64_t n_rows, int64_t width, const int32_t* row_expert,
                       const float* bias, int64_t n_expert);

  // Launches every call on `stream`, in order.
  void replay(cudaStream_t stream) const;

  bool empty() const { return calls_.empty(); }
  void clear() { calls_.clear(); }
  std::span<const KernelCall> calls() const { return calls_; }
  // From received calls; throws moe::Error on an unknown op or weight type (nothing is launched).
  static KernelBatch from(std::span<const KernelCall> calls);

 private:
  std::vector<KernelCall> calls_;
};

}  // namespace moe::gpu
