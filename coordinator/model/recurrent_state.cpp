#include "coordinator/model/recurrent_state.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace moe::model {

RecurrentState::RecurrentState(const ModelConfig& cfg) {
  layers_.resize(static_cast<size_t>(cfg.n_layer));
  conv_floats_ = (cfg.ssm_conv_kernel - 1) * cfg.ssm_conv_channels();
  ssm_floats_ = cfg.ssm_n_v_heads * cfg.ssm_head_v() * cfg.ssm_head_k;
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    if (!cfg.is_recurrent(l)) continue;
    Buffers& b = layers_[static_cast<size_t>(l)];
    for (int i = 0; i < 2; ++i) {
      b.conv[i].resize(static_cast<size_t>(conv_floats_));
      b.ssm[i].resize(static_cast<size_t>(ssm_floats_));
    }
  }
}

bool RecurrentState::has_layer(int64_t layer) const {
  return layer >= 0 && layer < static_cast<int64_t>(layers_.size()) &&
         !layers_[static_cast<size_t>(layer)].ssm[0].empty();
}

RecurrentState::LayerView RecurrentState::layer(int64_t layer) {
  if (!has_layer(layer)) {
    throw Error("sequence state has no recurrent state for layer " + std::to_string(layer) +
                " (a cache made for another model?)");
  }
  Buffers& b = layers_[static_cast<size_t>(layer)];
  LayerView v;
  v.conv_in = zero_ ? nullptr : b.conv[cur_].data();
  v.ssm_in = zero_ ? nullptr : b.ssm[cur_].data();
  v.conv_out = b.conv[1 - cur_].data();
  v.ssm_out = b.ssm[1 - cur_].data();
  return v;
}

void RecurrentState::save(Snapshot& s) const {
  s.zero = zero_;
  s.values.clear();
  if (zero_) return;
  for (const Buffers& b : layers_) {
    if (b.ssm[0].empty()) continue;
    s.values.insert(s.values.end(), b.conv[cur_].begin(), b.conv[cur_].end());
    s.values.insert(s.values.end(), b.ssm[cur_].begin(), b.ssm[cur_].end());
  }
}

void RecurrentState::restore(const Snapshot& s) {
  zero_ = s.zero;
  if (zero_) return;
  size_t at = 0;
  for (Buffers& b : layers_) {
    if (b.ssm[0].empty()) continue;
    if (at + b.conv[cur_].size() + b.ssm[cur_].size() > s.values.size()) {
      throw Error("recurrent state: the checkpoint was taken for another model");
    }
    std::copy_n(s.values.begin() + static_cast<std::ptrdiff_t>(at), b.conv[cur_].size(),
                b.conv[cur_].begin());
    at += b.conv[cur_].size();
    std::copy_n(s.values.begin() + static_cast<std::ptrdiff_t>(at), b.ssm[cur_].size(),
                b.ssm[cur_].begin());
    at += b.ssm[cur_].size();
  }
}

void RecurrentState::commit() {
  cur_ = 1 - cur_;
  zero_ = false;
}

}  // namespace moe::model
