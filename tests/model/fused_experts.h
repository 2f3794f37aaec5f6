// Writes a copy of a GGUF whose layers store their gate and up experts fused into one
// ffn_gate_up_exps [n_embd, 2 * n_ff, n_expert] tensor (each expert's gate rows, then its up
// rows), as some real qwen35moe files do. Header-only, for tests.
#pragma once

#include <cstring>
#include <string>

#include "common/gguf.h"
#include "tests/model/gguf_rewrite.h"

namespace moe::test {

inline void write_fused_gate_up(const std::string& src_path, const std::string& dst_path) {
  const gguf::GgufFile src = gguf::GgufFile::open(src_path);
  GgufEdit e;
  const auto is_gate_or_up = [](const std::string& n) {
    return n.find(".ffn_gate_exps.") != std::string::npos ||
           n.find(".ffn_up_exps.") != std::string::npos;
  };
  e.mutate = [&](const std::string& name, GgmlType&, std::vector<int64_t>&, bool& skip) {
    skip = is_gate_or_up(name);
  };
  for (const auto& t : src.tensors()) {
    const std::string name(t.name);
    if (name.find(".ffn_gate_exps.") == std::string::npos) continue;
    const std::string layer = name.substr(0, name.find(".ffn_gate_exps."));
    const gguf::TensorInfo* gate = &t;
    const gguf::TensorInfo* up = src.find_tensor(layer + ".ffn_up_exps.weight");
    if (!up || up->type() != gate->type()) {
      throw std::runtime_error("write_fused_gate_up: " + layer +
                               " has no up tensor of gate's type");
    }
    const uint64_t per_expert = gate->n_bytes / static_cast<uint64_t>(gate->ne[2]);
    e.generated.push_back({layer + ".ffn_gate_up_exps.weight",
                           gate->type(),
                           {gate->ne[0], 2 * gate->ne[1], gate->ne[2]},
                           [gate, up, per_expert](uint8_t* dst, uint64_t) {
                             for (int64_t x = 0; x < gate->ne[2]; ++x) {
                               std::memcpy(dst, gate->data + x * per_expert, per_expert);
                               std::memcpy(dst + per_expert, up->data + x * per_expert, per_expert);
                               dst += 2 * per_expert;
                             }
                           }});
  }
  rewrite_gguf(src_path, dst_path, e);
}

}  // namespace moe::test
