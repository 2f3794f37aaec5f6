// Per-sequence state of a hybrid model's recurrent (gated DeltaNet) layers, always F32: the conv
// window (the last conv_kernel - 1 pre-conv inputs of every channel) and one DeltaNet matrix per
// value head. Double buffered so that a forward that throws leaves the sequence as it was without
// copying anything per token: a batch reads the committed buffer and writes the other one, and
// commit() (after the whole batch succeeded) makes that one current.
#pragma once

#include <cstdint>
#include <vector>

#include "experts/model_config.h"

namespace moe::model {

class RecurrentState {
 public:
  RecurrentState() = default;  // a model without recurrent layers
  explicit RecurrentState(const ModelConfig& cfg);

  struct LayerView {
    // [conv_kernel - 1][channels], oldest input first; null: all zeros (start of the sequence).
    const float* conv_in = nullptr;
    float* conv_out = nullptr;  // where the batch leaves its window (never aliases conv_in)
    // [n_v_heads][head_v][head_k] (llama.cpp's layout: row = value dim); null: all zeros.
    const float* ssm_in = nullptr;
    float* ssm_out = nullptr;
  };

  bool has_layer(int64_t layer) const;
  // The buffers of `layer`; throws moe::Error when it has no recurrent state.
  LayerView layer(int64_t layer);

  // The buffers written since the last commit become the state.
  void commit();
  // Back to the zero state of an empty sequence (nothing is written).
  void reset() { zero_ = true; }

  // A copy of the committed state (the prompt cache's checkpoints), and back to it.
  struct Snapshot {
    std::vector<float> values;  // every recurrent layer's conv window, then its DeltaNet matrices
    bool zero = true;
  };
  void save(Snapshot& s) const;
  void restore(const Snapshot& s);

  int64_t conv_floats() const { return conv_floats_; }  // per layer
  int64_t ssm_floats() const { return ssm_floats_; }    // per layer

 private:
  struct Buffers {
    std::vector<float> conv[2], ssm[2];
  };
  std::vector<Buffers> layers_;  // by model layer; empty for attention layers
  int64_t conv_floats_ = 0, ssm_floats_ = 0;
  int cur_ = 0;       // the committed buffer
  bool zero_ = true;  // the committed state is all zeros; its buffer's contents do not matter
};

}  // namespace moe::model
