#include "experts/expert_tensors.h"

#include <string>

#include "common/error.h"
#include "experts/tensor_table.h"

namespace moe::model {
namespace {

ExpertProjection projection(const gguf::TensorInfo& t, int64_t n_in, int64_t n_out,
                            int64_t rows_per_expert, int64_t row0) {
  ExpertProjection p;
  p.tensor = &t;
  p.n_in = n_in;
  p.n_out = n_out;
  p.rows_per_expert = rows_per_expert;
  p.row0 = row0;
  // weight_matrix checks the type and the row size, naming the tensor.
  p.row_bytes = expert_matrix(t, 0).row_bytes;
  return p;
}

}  // namespace

cpu::WeightMatrix ExpertProjection::matrix(int64_t expert) const {
  cpu::WeightMatrix w;
  w.type = type();
  w.data = data(expert);
  w.n_in = n_in;
  w.n_out = n_out;
  w.row_bytes = row_bytes;
  return w;
}

std::vector<const gguf::TensorInfo*> ExpertLayerTensors::tensors() const {
  std::vector<const gguf::TensorInfo*> v = {gate.tensor};
  if (up.tensor != gate.tensor) v.push_back(up.tensor);
  v.push_back(down.tensor);
  return v;
}

uint64_t ExpertLayerTensors::bytes() const {
  uint64_t b = 0;
  for (const gguf::TensorInfo* t : tensors()) b += t->n_bytes;
  return b;
}

ExpertLayerTensors require_expert_tensors(const gguf::GgufFile& f, int64_t layer, int64_t n_embd,
                                          int64_t n_ff, int64_t n_expert) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  ExpertLayerTensors et;
  const gguf::TensorInfo* fused = f.find_tensor(p + "ffn_gate_up_exps.weight");
  if (fused &&
      (f.find_tensor(p + "ffn_gate_exps.weight") || f.find_tensor(p + "ffn_up_exps.weight"))) {
    throw Error(p + "ffn_gate_up_exps.weight: the file also has separate gate/up expert tensors");
  }
  if (fused) {
    const gguf::TensorInfo& t =
        require_tensor(f, p + "ffn_gate_up_exps.weight", {n_embd, 2 * n_ff, n_expert});
    et.gate = projection(t, n_embd, n_ff, 2 * n_ff, 0);
    et.up = projection(t, n_embd, n_ff, 2 * n_ff, n_ff);
  } else {
    et.gate = projection(require_tensor(f, p + "ffn_gate_exps.weight", {n_embd, n_ff, n_expert}),
                         n_embd, n_ff, n_ff, 0);
    et.up = projection(require_tensor(f, p + "ffn_up_exps.weight", {n_embd, n_ff, n_expert}),
                       n_embd, n_ff, n_ff, 0);
  }
  et.down = projection(require_tensor(f, p + "ffn_down_exps.weight", {n_ff, n_embd, n_expert}),
                       n_ff, n_embd, n_embd, 0);
  return et;
}

namespace {

const gguf::TensorInfo* require_bias(const gguf::GgufFile& f, const std::string& name, int64_t n,
                                     int64_t n_expert) {
  const gguf::TensorInfo& t = require_tensor(f, name, {n, n_expert});
  // Read in place as floats by the executors.
  if (t.type() != GgmlType::F32) throw Error(name + ": expert biases must be F32");
  return &t;
}

}  // namespace

void require_expert_biases(const gguf::GgufFile& f, int64_t layer, int64_t n_embd, int64_t n_ff,
                           int64_t n_expert, ExpertLayerTensors& et) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  et.gate_bias = require_bias(f, p + "ffn_gate_exps.bias", n_ff, n_expert);
  et.up_bias = require_bias(f, p + "ffn_up_exps.bias", n_ff, n_expert);
  et.down_bias = require_bias(f, p + "ffn_down_exps.bias", n_embd, n_expert);
}

ExpertLayerTensors require_layer_experts(const gguf::GgufFile& f, const ModelConfig& cfg,
                                         int64_t layer) {
  ExpertLayerTensors et = require_expert_tensors(f, layer, cfg.n_embd, cfg.n_ff_exp, cfg.n_expert);
  if (cfg.expert_bias) {
    require_expert_biases(f, layer, cfg.n_embd, cfg.n_ff_exp, cfg.n_expert, et);
  }
  return et;
}

}  // namespace moe::model
