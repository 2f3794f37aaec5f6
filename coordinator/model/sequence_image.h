// One sequence's state as plain host bytes (ModelArch::export_sequence / import_sequence): what a
// slot file (coordinator/engine/slot_file.h) holds besides the tokens. The same bytes whether the
// state lived in a host KvCache or in a GPU forward's VRAM: K/V rows in their cache types, as
// stored (rotated where the layer rotates), and the recurrent state in f32.
#pragma once

#include <cstdint>
#include <vector>

namespace moe::model {

struct SequenceImage {
  int64_t n_past = 0;  // positions evaluated
  struct Layer {
    // Attention layers: rows [0, n_past), n_past * the layer's row bytes each; empty otherwise.
    std::vector<unsigned char> k, v;
    // Recurrent layers: the committed conv window ([kernel - 1][channels]) and DeltaNet matrices
    // ([n_v_heads][head_v][head_k]); zeros at n_past 0; empty for attention layers.
    std::vector<float> conv, ssm;
  };
  std::vector<Layer> layers;  // one per model layer
};

}  // namespace moe::model
