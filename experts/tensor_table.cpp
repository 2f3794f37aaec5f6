#include "experts/tensor_table.h"

#include "common/error.h"
#include "kernels/cpu/dequant.h"

namespace moe::model {

std::string shape_string(const std::vector<int64_t>& ne) {
  std::string s;
  for (size_t i = 0; i < ne.size(); ++i) {
    if (i) s.push_back('x');
    s.append(std::to_string(ne[i]));
  }
  return s;
}

const gguf::TensorInfo* optional_tensor(const gguf::GgufFile& f, const std::string& name,
                                        const std::vector<int64_t>& ne) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) return nullptr;
  std::vector<int64_t> found(t->ne, t->ne + t->n_dims);
  if (found != ne) {
    throw Error(name + ": expected shape " + shape_string(ne) + ", found " + shape_string(found));
  }
  const auto info = ggml_type_info(t->type_id);
  if (!info || !info->computable) {
    throw Error(name + ": unsupported tensor type " + ggml_type_label(t->type_id));
  }
  return t;
}

const gguf::TensorInfo& require_tensor(const gguf::GgufFile& f, const std::string& name,
                                       const std::vector<int64_t>& ne) {
  const gguf::TensorInfo* t = optional_tensor(f, name, ne);
  if (!t)
    throw Error(name + ": required tensor is missing (expected shape " + shape_string(ne) + ")");
  return *t;
}

cpu::WeightMatrix weight_matrix(const gguf::TensorInfo& t) {
  try {
    return cpu::make_weight_matrix(t.type(), t.data, t.ne[0], t.ne[1]);
  } catch (const Error& e) {
    throw Error(std::string(t.name) + ": " + e.what());
  }
}

cpu::WeightMatrix expert_matrix(const gguf::TensorInfo& t, int64_t expert) {
  cpu::WeightMatrix w;
  try {
    w = cpu::make_weight_matrix(t.type(), t.data, t.ne[0], t.ne[1]);
  } catch (const Error& e) {
    throw Error(std::string(t.name) + ": " + e.what());
  }
  // Experts are stacked along the slowest dimension: expert e starts n_out rows further on.
  w.data = t.data + static_cast<size_t>(expert) * static_cast<size_t>(t.ne[1]) * w.row_bytes;
  return w;
}

std::vector<float> vector_f32(const gguf::TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  try {
    cpu::dequantize_row(t.type(), t.data, v.data(), t.n_elements());
  } catch (const Error& e) {
    throw Error(std::string(t.name) + ": " + e.what());
  }
  return v;
}

void EmbeddingTensors::embed(std::span<const int32_t> tokens, float* x) const {
  const int64_t n = token_embd->ne[0];
  const auto row =
      static_cast<size_t>(*ggml_row_bytes(token_embd->type(), static_cast<uint64_t>(n)));
  for (size_t i = 0; i < tokens.size(); ++i) {
    cpu::dequantize_row(token_embd->type(), token_embd->data + static_cast<size_t>(tokens[i]) * row,
                        x + static_cast<int64_t>(i) * n, n);
  }
}

EmbeddingTensors require_embedding_tensors(const gguf::GgufFile& f, int64_t n_embd,
                                           int64_t n_vocab) {
  EmbeddingTensors t;
  t.token_embd = &require_tensor(f, "token_embd.weight", {n_embd, n_vocab});
  t.output_norm = &require_tensor(f, "output_norm.weight", {n_embd});
  const gguf::TensorInfo* out = optional_tensor(f, "output.weight", {n_embd, n_vocab});
  t.output = out ? out : t.token_embd;
  return t;
}

}  // namespace moe::model
