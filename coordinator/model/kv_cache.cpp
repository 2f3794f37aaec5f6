#include "coordinator/model/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/fp16.h"
#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/hadamard.h"
#include "kernels/cpu/kv_quant.h"

namespace moe::model {

KvType parse_kv_type(std::string_view name) {
  if (name == "f32") return KvType::F32;
  if (name == "f16") return KvType::F16;
  if (name == "q8_0") return KvType::Q8_0;
  if (name == "q4_0") return KvType::Q4_0;
  if (name == "bf16") return KvType::BF16;
  if (name == "q4_1") return KvType::Q4_1;
  if (name == "q5_0") return KvType::Q5_0;
  if (name == "q5_1") return KvType::Q5_1;
  if (name == "iq4_nl") return KvType::IQ4_NL;
  throw Error("unsupported KV cache type '" + std::string(name) +
              "' (supported: f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1, iq4_nl)");
}

std::string_view kv_type_name(KvType t) {
  switch (t) {
    case KvType::F32:
      return "f32";
    case KvType::F16:
      return "f16";
    case KvType::Q8_0:
      return "q8_0";
    case KvType::Q4_0:
      return "q4_0";
    case KvType::BF16:
      return "bf16";
    case KvType::Q4_1:
      return "q4_1";
    case KvType::Q5_0:
      return "q5_0";
    case KvType::Q5_1:
      return "q5_1";
    case KvType::IQ4_NL:
      return "iq4_nl";
  }
  return "?";
}

GgmlType kv_ggml_type(KvType t) {
  switch (t) {
    case KvType::F32:
      return GgmlType::F32;
    case KvType::F16:
      return GgmlType::F16;
    case KvType::Q8_0:
      return GgmlType::Q8_0;
    case KvType::Q4_0:
      return GgmlType::Q4_0;
    case KvType::BF16:
      return GgmlType::BF16;
    case KvType::Q4_1:
      return GgmlType::Q4_1;
    case KvType::Q5_0:
      return GgmlType::Q5_0;
    case KvType::Q5_1:
      return GgmlType::Q5_1;
    case KvType::IQ4_NL:
      return GgmlType::IQ4_NL;
  }
  return GgmlType::F32;
}

bool kv_type_quantized(KvType t) {
  return t != KvType::F32 && t != KvType::F16 && t != KvType::BF16;
}

namespace {

// The ISA the cache rows are decoded with, asked once (MOE_ISA lowers it, as for the kernels).
cpu::Isa read_isa() {
  static const cpu::Isa isa = cpu::best_isa();
  return isa;
}

KvType layer_type(KvType all, const std::optional<KvConfig::Override>& first,
                  const std::optional<KvConfig::Override>& last, int64_t index, int64_t n) {
  KvType t = all;
  if (first && index < first->n_layers) t = first->type;
  if (last && index >= n - last->n_layers) t = last->type;
  return t;
}

}  // namespace

KvType KvConfig::k_type(int64_t index, int64_t n) const {
  return layer_type(k, k_first, k_last, index, n);
}
KvType KvConfig::v_type(int64_t index, int64_t n) const {
  return layer_type(v, v_first, v_last, index, n);
}

KvConfig::Override KvConfig::parse_override(std::string_view spec, std::string_view flag) {
  const size_t comma = spec.find(',');
  const std::string bad = std::string(flag) + " '" + std::string(spec) + "': ";
  if (comma == std::string_view::npos) throw Error(bad + "expected TYPE,N (e.g. q8_0,4)");
  Override o{};
  try {
    o.type = parse_kv_type(spec.substr(0, comma));
  } catch (const Error& e) {
    throw Error(bad + e.what());
  }
  const std::string n(spec.substr(comma + 1));
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(n, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (n.empty() || used != n.size() || v < 0 || v > 1 << 20) {
    throw Error(bad + "N must be a layer count >= 0");
  }
  o.n_layers = v;
  return o;
}

KvCache::KvCache(const ModelConfig& cfg, int64_t n_ctx, const KvConfig& kv, KvStorage storage)
    : n_ctx_(n_ctx), storage_(storage) {
  if (n_ctx < 1 || n_ctx > (int64_t{1} << 24)) {
    throw Error("invalid context length " + std::to_string(n_ctx));
  }
  int64_t n_attention = 0;
  for (int64_t l = 0; l < cfg.n_layer; ++l) n_attention += cfg.is_recurrent(l) ? 0 : 1;
  first_attention_ = -1;
  layers_.resize(static_cast<size_t>(cfg.n_layer));
  int64_t index = 0;  // among attention layers
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    if (cfg.is_recurrent(l)) continue;
    if (first_attention_ < 0) first_attention_ = l;
    Layer& L = layers_[static_cast<size_t>(l)];
    const KvType k_type = kv.k_type(index, n_attention), v_type = kv.v_type(index, n_attention);
    ++index;
    L.k_type = k_type;
    L.v_type = v_type;
    if (kv.rotate && kv_type_quantized(k_type)) L.k_rot = cpu::hadamard_block_k(cfg.head_dim_k);
    if (kv.rotate && kv_type_quantized(v_type)) L.v_rot = cpu::hadamard_block_v(cfg.head_dim_v);
    L.k_elems = cfg.n_head_kv[static_cast<size_t>(l)] * cfg.head_dim_k;
    L.v_elems = cfg.n_head_kv[static_cast<size_t>(l)] * cfg.head_dim_v;
    const auto kb = ggml_row_bytes(kv_ggml_type(k_type), static_cast<uint64_t>(L.k_elems));
    const auto vb = ggml_row_bytes(kv_ggml_type(v_type), static_cast<uint64_t>(L.v_elems));
    // Quantized blocks must not straddle heads, or a head could not be decoded on its own.
    const int64_t kblk = ggml_type_info_or_throw(kv_ggml_type(k_type)).block_size;
    const int64_t vblk = ggml_type_info_or_throw(kv_ggml_type(v_type)).block_size;
    if (!kb || !vb || cfg.head_dim_k % kblk != 0 || cfg.head_dim_v % vblk != 0) {
      throw Error("KV cache type " + std::string(kv_type_name(kb ? v_type : k_type)) +
                  " needs head dimensions that are multiples of its block size");
    }
    L.k_row_bytes = static_cast<size_t>(*kb);
    L.v_row_bytes = static_cast<size_t>(*vb);
    // Rings alike wherever the rows live (a GPU forward allocates its own from ring_rows()).
    if (cfg.is_swa(l) && cfg.n_swa > 0 && !kv.swa_full) {
      if (kv.swa_slack < 1) throw Error("KV cache: the sliding-window slack must be >= 1");
      const int64_t ring = cfg.n_swa + kv.swa_slack;
      if (ring < n_ctx) {
        L.ring = ring;
        L.n_swa = cfg.n_swa;
        ring_slack_ = kv.swa_slack;
      }
    }
    if (storage == KvStorage::None) continue;
    const auto rows = static_cast<size_t>(L.ring > 0 ? L.ring : n_ctx);
    L.k.resize(L.k_row_bytes * rows);
    L.v.resize(L.v_row_bytes * rows);
  }
  if (first_attention_ < 0) first_attention_ = 0;
  if (!cfg.recurrent.empty() && storage == KvStorage::Host) rs_ = RecurrentState(cfg);
  recurrent_ = cfg.has_recurrent();
  if (recurrent_) {
    conv_floats_ = (cfg.ssm_conv_kernel - 1) * cfg.ssm_conv_channels();
    ssm_floats_ = cfg.ssm_n_v_heads * cfg.ssm_head_v() * cfg.ssm_head_k;
  }
}

const KvCache::Layer& KvCache::layer_at(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) {
    throw Error("KV cache: no layer " + std::to_string(layer));
  }
  return layers_[static_cast<size_t>(layer)];
}

uint64_t KvCache::bytes() const {
  uint64_t b = 0;
  for (const Layer& L : layers_) {
    b += (L.k_row_bytes + L.v_row_bytes) * static_cast<uint64_t>(L.ring > 0 ? L.ring : n_ctx_);
  }
  return b;
}

int64_t KvCache::max_step(int64_t layer) const {
  const Layer& L = layer_at(layer);
  return L.ring > 0 ? L.ring - L.n_swa + 1 : n_ctx_;
}

int64_t KvCache::image_rows(const Layer& L, int64_t n_past) {
  return L.ring > 0 ? std::min(n_past, L.ring) : n_past;
}

std::string KvCache::describe() const {
  // Runs of attention layers with the same K and V types, then whether anything is rotated.
  std::string s;
  bool rotated = false;
  size_t l = 0;
  while (l < layers_.size()) {
    if (layers_[l].k_row_bytes == 0) {
      ++l;
      continue;
    }
    const Layer& a = layers_[l];
    size_t end = l + 1, last = l;
    while (end < layers_.size() &&
           (layers_[end].k_row_bytes == 0 ||
            (layers_[end].k_type == a.k_type && layers_[end].v_type == a.v_type))) {
      if (layers_[end].k_row_bytes != 0) last = end;
      ++end;
    }
    if (!s.empty()) s += ", ";
    s += "layers " + std::to_string(l) + "-" + std::to_string(last) + " K " +
         std::string(kv_type_name(a.k_type)) + " V " + std::string(kv_type_name(a.v_type));
    l = last + 1;
  }
  int64_t rings = 0, ring = 0;
  for (const Layer& L : layers_) {
    rotated = rotated || L.k_rot || L.v_rot;
    if (L.ring > 0) ++rings, ring = L.ring;
  }
  if (rings > 0) {
    s += ", " + std::to_string(rings) + " sliding-window layers keep their last " +
         std::to_string(ring) + " positions";
  }
  return s + (rotated ? ", quantized rows Hadamard-rotated" : "") + "; " +
         std::to_string(bytes() >> 20) + " MiB for " + std::to_string(n_ctx_) + " positions";
}

void KvCache::truncate(int64_t n) {
  if (!can_truncate_to(n)) {
    throw Error("KV cache: cannot keep " + std::to_string(n) + " of " + std::to_string(n_past_) +
                " positions" + (recurrent_ ? " (a recurrent state cannot be rewound)" : ""));
  }
  if (n == 0) {
    clear();
    return;
  }
  n_past_ = n;
  if (checkpoint_pos_ > n) checkpoint_pos_ = -1;
}

void KvCache::save_checkpoint() {
  checkpoint_pos_ = n_past_;
  checkpoint_written_ = written_;
  if (storage_ != KvStorage::Host) return;
  rs_.save(checkpoint_);
  checkpoint_rings_.clear();
  for (const Layer& L : layers_) {
    if (L.ring == 0) continue;
    std::vector<unsigned char>& c = checkpoint_rings_.emplace_back(L.k);
    c.insert(c.end(), L.v.begin(), L.v.end());
  }
}

void KvCache::restore_checkpoint() {
  if (checkpoint_pos_ < 0 || checkpoint_pos_ > n_past_) {
    throw Error("KV cache: no checkpoint to go back to");
  }
  if (storage_ == KvStorage::Host) {
    rs_.restore(checkpoint_);
    size_t i = 0;
    for (Layer& L : layers_) {
      if (L.ring == 0) continue;
      const std::vector<unsigned char>& c = checkpoint_rings_.at(i++);
      std::copy_n(c.begin(), L.k.size(), L.k.begin());
      std::copy_n(c.begin() + static_cast<std::ptrdiff_t>(L.k.size()), L.v.size(), L.v.begin());
    }
  }
  n_past_ = checkpoint_pos_;
  written_ = checkpoint_written_;  // the rings hold the checkpoint's rows again
}

void KvCache::require_host(const char* what) const {
  if (storage_ == KvStorage::None) {
    throw Error(std::string("KV cache: ") + what +
                " needs host storage; this cache was made for a GPU model, whose sequence state "
                "lives in VRAM");
  }
}

void KvCache::check_room(int64_t n) const {
  if (n < 0 || n_past_ + n > n_ctx_) {
    throw Error("context length " + std::to_string(n_ctx_) + " exceeded (" +
                std::to_string(n_past_) + " positions used, " + std::to_string(n) +
                " more requested)");
  }
}

void KvCache::store(int64_t layer, int64_t pos, const float* k_row, const float* v_row) {
  if (pos < 0 || pos >= n_ctx_) {
    throw Error("context length " + std::to_string(n_ctx_) + " exceeded (position " +
                std::to_string(pos) + ")");
  }
  require_host("store");
  Layer& L = layers_.at(static_cast<size_t>(layer));
  if (L.k_row_bytes == 0) {
    throw Error("layer " + std::to_string(layer) + " is recurrent and keeps no K/V");
  }
  const auto rotated = [&](const float* row, int64_t n, int64_t block) {
    if (block == 0) return row;
    rotated_.assign(row, row + n);
    cpu::hadamard_blocks(rotated_.data(), n, block);
    return static_cast<const float*>(rotated_.data());
  };
  cpu::encode_kv_row(kv_ggml_type(L.k_type), rotated(k_row, L.k_elems, L.k_rot),
                     L.k.data() + L.row(pos) * L.k_row_bytes, L.k_elems);
  cpu::encode_kv_row(kv_ggml_type(L.v_type), rotated(v_row, L.v_elems, L.v_rot),
                     L.v.data() + L.row(pos) * L.v_row_bytes, L.v_elems);
}

const float* KvCache::k_f32(int64_t layer) const {
  require_host("reading K");
  const Layer& L = layer_at(layer);
  if (L.k_type != KvType::F32 || L.ring > 0) return nullptr;
  return reinterpret_cast<const float*>(L.k.data());
}

const float* KvCache::v_f32(int64_t layer) const {
  require_host("reading V");
  const Layer& L = layer_at(layer);
  if (L.v_type != KvType::F32 || L.ring > 0) return nullptr;
  return reinterpret_cast<const float*>(L.v.data());
}

namespace {

// Rows of positions [pos, pos + n) of one side of a layer: contiguous, or on a ring up to two
// runs (before and after the wrap).
void read_rows(GgmlType type, const std::vector<unsigned char>& data, size_t row_bytes,
               int64_t ring, int64_t pos, int64_t n, int64_t elems, float* dst, cpu::Isa isa) {
  if (n < 0 || pos < 0) throw Error("KV cache: negative rows requested");
  if (ring > 0 && n > ring) {
    throw Error("KV cache: " + std::to_string(n) +
                " rows requested from a sliding-window ring of " + std::to_string(ring));
  }
  while (n > 0) {
    const int64_t row = ring > 0 ? pos % ring : pos;
    const int64_t run = ring > 0 ? std::min(n, ring - row) : n;
    cpu::decode_kv_rows(type, data.data() + static_cast<size_t>(row) * row_bytes, row_bytes, run,
                        elems, dst, isa);
    pos += run;
    n -= run;
    dst += run * elems;
  }
}

}  // namespace

void KvCache::read_k(int64_t layer, int64_t pos, int64_t n, float* dst) const {
  require_host("reading K");
  const Layer& L = layers_.at(static_cast<size_t>(layer));
  read_rows(kv_ggml_type(L.k_type), L.k, L.k_row_bytes, L.ring, pos, n, L.k_elems, dst, read_isa());
}

void KvCache::read_v(int64_t layer, int64_t pos, int64_t n, float* dst) const {
  require_host("reading V");
  const Layer& L = layers_.at(static_cast<size_t>(layer));
  read_rows(kv_ggml_type(L.v_type), L.v, L.v_row_bytes, L.ring, pos, n, L.v_elems, dst, read_isa());
}

std::span<uint8_t> KvCache::k_row_data(int64_t layer, int64_t pos) {
  require_host("K row access");
  (void)layer_at(layer);  // moe::Error for a layer that does not exist
  Layer& L = layers_[static_cast<size_t>(layer)];
  if (L.k_row_bytes == 0 || pos < 0 || pos >= n_ctx_) {
    throw Error("KV cache: no K row " + std::to_string(pos) + " in layer " + std::to_string(layer));
  }
  return {L.k.data() + L.row(pos) * L.k_row_bytes, L.k_row_bytes};
}

std::span<uint8_t> KvCache::v_row_data(int64_t layer, int64_t pos) {
  require_host("V row access");
  (void)layer_at(layer);  // moe::Error for a layer that does not exist
  Layer& L = layers_[static_cast<size_t>(layer)];
  if (L.v_row_bytes == 0 || pos < 0 || pos >= n_ctx_) {
    throw Error("KV cache: no V row " + std::to_string(pos) + " in layer " + std::to_string(layer));
  }
  return {L.v.data() + L.row(pos) * L.v_row_bytes, L.v_row_bytes};
}

void KvCache::drop_positions(int64_t n_keep, int64_t n) {
  if (recurrent_) {
    throw Error("KV cache: a recurrent state cannot drop positions (no context shift)");
  }
  if (n_keep < 0 || n < 1 || n_keep > n_past_ - n) {
    throw Error("KV cache: cannot drop " + std::to_string(n) + " positions after " +
                std::to_string(n_keep) + " of " + std::to_string(n_past_));
  }
  n_past_ -= n;
  written_ = n_past_;  // the shift rewrote the rings' rows up to here
  checkpoint_pos_ = -1;
}

void KvCache::advance(int64_t n) {
  check_room(n);
  n_past_ += n;
  written_ = std::max(written_, n_past_);
  if (n > 0) rs_.commit();
}

void KvCache::check_image(const SequenceImage& img) const {
  if (img.layers.size() != layers_.size()) {
    throw Error("sequence image of " + std::to_string(img.layers.size()) +
                " layers for a model of " + std::to_string(layers_.size()));
  }
  if (img.n_past < 0 || img.n_past > n_ctx_) {
    throw Error("sequence image of " + std::to_string(img.n_past) + " positions for a context of " +
                std::to_string(n_ctx_));
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const SequenceImage::Layer& I = img.layers[l];
    const auto n = static_cast<size_t>(image_rows(L, img.n_past));
    const bool rec = recurrent_ && L.k_row_bytes == 0;
    const size_t conv = rec ? static_cast<size_t>(conv_floats_) : 0;
    const size_t ssm = rec ? static_cast<size_t>(ssm_floats_) : 0;
    if (I.k.size() != n * L.k_row_bytes || I.v.size() != n * L.v_row_bytes ||
        I.conv.size() != conv || I.ssm.size() != ssm) {
      throw Error("sequence image: layer " + std::to_string(l) + " does not match this cache (" +
                  (rec ? "recurrent state" : "K/V rows") + " of another size)");
    }
  }
}

void KvCache::export_image(SequenceImage& img) const {
  require_host("exporting the sequence");
  img.n_past = n_past_;
  img.layers.assign(layers_.size(), {});
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    SequenceImage::Layer& I = img.layers[l];
    // In position order; a ring's last rows start at position n_past - rows.
    const int64_t rows = image_rows(L, n_past_);
    for (int64_t p = n_past_ - rows; p < n_past_; ++p) {
      const auto k = L.k.begin() + static_cast<std::ptrdiff_t>(L.row(p) * L.k_row_bytes);
      const auto v = L.v.begin() + static_cast<std::ptrdiff_t>(L.row(p) * L.v_row_bytes);
      I.k.insert(I.k.end(), k, k + static_cast<std::ptrdiff_t>(L.k_row_bytes));
      I.v.insert(I.v.end(), v, v + static_cast<std::ptrdiff_t>(L.v_row_bytes));
    }
  }
  if (!recurrent_) return;
  // The snapshot is every recurrent layer's conv window, then its matrices, in layer order.
  RecurrentState::Snapshot snap;
  rs_.save(snap);
  size_t at = 0;
  for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) {
    if (!rs_.has_layer(l)) continue;
    SequenceImage::Layer& I = img.layers[static_cast<size_t>(l)];
    I.conv.assign(static_cast<size_t>(conv_floats_), 0.0f);
    I.ssm.assign(static_cast<size_t>(ssm_floats_), 0.0f);
    if (snap.zero) continue;
    std::copy_n(snap.values.begin() + static_cast<std::ptrdiff_t>(at), I.conv.size(),
                I.conv.begin());
    at += I.conv.size();
    std::copy_n(snap.values.begin() + static_cast<std::ptrdiff_t>(at), I.ssm.size(), I.ssm.begin());
    at += I.ssm.size();
  }
}

void KvCache::import_image(const SequenceImage& img) {
  require_host("importing the sequence");
  check_image(img);
  RecurrentState::Snapshot snap;
  snap.zero = img.n_past == 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& L = layers_[l];
    const SequenceImage::Layer& I = img.layers[l];
    const int64_t rows = image_rows(L, img.n_past);
    for (int64_t i = 0; i < rows && L.k_row_bytes > 0; ++i) {
      const size_t r = L.row(img.n_past - rows + i);
      std::copy_n(I.k.begin() + static_cast<std::ptrdiff_t>(i * L.k_row_bytes), L.k_row_bytes,
                  L.k.begin() + static_cast<std::ptrdiff_t>(r * L.k_row_bytes));
      std::copy_n(I.v.begin() + static_cast<std::ptrdiff_t>(i * L.v_row_bytes), L.v_row_bytes,
                  L.v.begin() + static_cast<std::ptrdiff_t>(r * L.v_row_bytes));
    }
    if (!snap.zero) {
      snap.values.insert(snap.values.end(), I.conv.begin(), I.conv.end());
      snap.values.insert(snap.values.end(), I.ssm.begin(), I.ssm.end());
    }
  }
  if (recurrent_) rs_.restore(snap);
  n_past_ = img.n_past;
  written_ = n_past_;
  checkpoint_pos_ = -1;
}

void KvCache::restore(int64_t n) {
  if (storage_ == KvStorage::Host) {
    throw Error("KV cache: restore(n) is for a cache whose state lives in VRAM; use import_image");
  }
  if (n < 0 || n > n_ctx_) {
    throw Error("KV cache: cannot hold " + std::to_string(n) + " positions in a context of " +
                std::to_string(n_ctx_));
  }
  n_past_ = n;
  written_ = n;
  checkpoint_pos_ = -1;
}

}  // namespace moe::model
