// Looking up the tensors an architecture needs, each checked for presence, exact shape and a type
// we can compute with; every error names the tensor.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "kernels/cpu/matmul.h"

namespace moe::model {

// "256x256x16" (ggml ne order, fastest first).
std::string shape_string(const std::vector<int64_t>& ne);

// The tensor `name` with exactly the shape `ne`, or moe::Error. Its type must be computable.
const gguf::TensorInfo& require_tensor(const gguf::GgufFile& f, const std::string& name,
                                       const std::vector<int64_t>& ne);

// Like require_tensor, but nullptr when absent (optional tensors such as output.weight).
const gguf::TensorInfo* optional_tensor(const gguf::GgufFile& f, const std::string& name,
                                        const std::vector<int64_t>& ne);

// A 2-D tensor as a matmul weight (n_in = ne[0], n_out = ne[1]); errors name the tensor.
cpu::WeightMatrix weight_matrix(const gguf::TensorInfo& t);

// One expert's [n_in, n_out] slab of a 3-D [n_in, n_out, n_expert] tensor.
cpu::WeightMatrix expert_matrix(const gguf::TensorInfo& t, int64_t expert);

// A 1-D tensor (norm gains) decoded to float.
std::vector<float> vector_f32(const gguf::TensorInfo& t);

// What every architecture has around its layers: token_embd [n_embd, n_vocab] (rows decoded per
// token, as llama.cpp keeps it in RAM), output_norm [n_embd], and the output head: output.weight,
// or token_embd itself when the file ties them.
struct EmbeddingTensors {
  const gguf::TensorInfo* token_embd = nullptr;
  const gguf::TensorInfo* output_norm = nullptr;
  const gguf::TensorInfo* output = nullptr;
  // x row i = the decoded embedding of tokens[i] (ids already checked against n_vocab).
  void embed(std::span<const int32_t> tokens, float* x) const;
};
EmbeddingTensors require_embedding_tensors(const gguf::GgufFile& f, int64_t n_embd,
                                           int64_t n_vocab);

}  // namespace moe::model
