// Where a layer's routed experts live in a GGUF file. Files stack every expert of a projection in
// one 3-D tensor: ffn_gate_exps / ffn_up_exps [n_embd, n_ff, n_expert] and ffn_down_exps [n_ff,
// n_embd, n_expert]; some qwen35moe files fuse gate and up into ffn_gate_up_exps [n_embd,
// 2 * n_ff, n_expert], each expert's block holding its gate rows then its up rows. Every user
// (the CPU executor, the worker process, the GPU residency) sees one projection as an
// ExpertProjection and never needs to know which layout the file has.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/gguf.h"
#include "experts/model_config.h"
#include "kernels/cpu/matmul.h"

namespace moe::model {

// One projection of a layer's experts: expert e's [n_in, n_out] matrix is n_out consecutive rows
// of `tensor`, from row e * rows_per_expert + row0.
struct ExpertProjection {
  const gguf::TensorInfo* tensor = nullptr;
  int64_t n_in = 0, n_out = 0;
  int64_t rows_per_expert = 0;  // n_out, or 2 * n_ff in a fused gate_up tensor
  int64_t row0 = 0;             // 0, or n_ff for up in a fused gate_up tensor
  size_t row_bytes = 0;

  GgmlType type() const { return tensor->type(); }
  size_t expert_bytes() const { return static_cast<size_t>(n_out) * row_bytes; }
  // Byte offset of expert e's matrix from the start of the tensor.
  size_t offset(int64_t expert) const {
    return static_cast<size_t>(expert * rows_per_expert + row0) * row_bytes;
  }
  const uint8_t* data(int64_t expert) const { return tensor->data + offset(expert); }
  cpu::WeightMatrix matrix(int64_t expert) const;
};

struct ExpertLayerTensors {
  ExpertProjection gate, up, down;
  // gpt-oss: per-expert biases, F32 [n_ff, n_expert] (gate, up) and [n_embd, n_expert] (down),
  // added after each projection; null when the model has none. Not among tensors().
  const gguf::TensorInfo *gate_bias = nullptr, *up_bias = nullptr, *down_bias = nullptr;
  // The distinct file tensors behind the three projections (two when gate and up are fused).
  std::vector<const gguf::TensorInfo*> tensors() const;
  uint64_t bytes() const;  // of those tensors
};

// Layer `layer`'s blk.L.ffn_{gate,up,down}_exps.weight or blk.L.ffn_gate_up_exps.weight +
// ffn_down_exps, each checked for presence, exact shape and a computable type (moe::Error naming
// the tensor otherwise). Shared by the model, which checks them while loading, and the CPU worker
// process, which computes with them.
ExpertLayerTensors require_expert_tensors(const gguf::GgufFile& f, int64_t layer, int64_t n_embd,
                                          int64_t n_ff, int64_t n_expert);

// Layer `layer`'s blk.L.ffn_{gate,up,down}_exps.bias into `et`, each checked for presence, exact
// shape and type F32 (moe::Error naming the tensor otherwise).
void require_expert_biases(const gguf::GgufFile& f, int64_t layer, int64_t n_embd, int64_t n_ff,
                           int64_t n_expert, ExpertLayerTensors& et);

// What the model config says a layer's experts have: require_expert_tensors, plus
// require_expert_biases where cfg.expert_bias.
ExpertLayerTensors require_layer_experts(const gguf::GgufFile& f, const ModelConfig& cfg,
                                         int64_t layer);

}  // namespace moe::model
