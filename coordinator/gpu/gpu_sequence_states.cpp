#include "coordinator/gpu/gpu_sequence_states.h"

#include <algorithm>
#include <array>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_shift.h"

namespace moe::gpu {
namespace {

size_t kv_row_bytes(GgmlType t, int64_t elems, const char* which) {
  const auto b = ggml_row_bytes(t, static_cast<uint64_t>(elems));
  if (!b) {
    throw Error(std::string(which) + " cache row of " + std::to_string(elems) +
                " values does not split into " + ggml_type_label(static_cast<uint32_t>(t)) +
                " blocks");
  }
  return static_cast<size_t>(*b);
}

// Bytes of a sliding-window layer's whole ring, one side.
size_t ring_bytes(const cuda::DeviceKvLayer& d, bool k) {
  return static_cast<size_t>(d.ring) * (k ? d.k_row_bytes : d.v_row_bytes);
}

// The image rows of positions [n - rows, n) of one side of a layer, in position order, and the
// layer's rows: a ring's rows wrap (at most two runs), others are rows 0.. of their positions.
struct RowRun {
  int64_t image_row, layer_row, n;
};
std::vector<RowRun> image_runs(const cuda::DeviceKvLayer& d, int64_t n) {
  if (d.ring == 0) return {{0, 0, n}};
  const int64_t rows = std::min(n, d.ring), first = (n - rows) % d.ring;
  const int64_t run = std::min(rows, d.ring - first);
  std::vector<RowRun> runs{{0, first, run}};
  if (run < rows) runs.push_back({run, 0, rows - run});
  return runs;
}

size_t conv_floats(const model::ModelConfig& c) {
  return static_cast<size_t>((c.ssm_conv_kernel - 1) * c.ssm_conv_channels());
}
size_t ssm_floats(const model::ModelConfig& c) {
  return static_cast<size_t>(c.ssm_n_v_heads * c.ssm_head_v() * c.ssm_head_k);
}

}  // namespace

const cuda::DeviceKvLayer& GpuSequenceStates::Slot::kv(int64_t layer) const {
  const Layer& L = layers_.at(static_cast<size_t>(layer));
  if (!L.k) throw Error("GPU sequence state: layer " + std::to_string(layer) + " has no K/V");
  return L.view;
}

GpuSequenceStates::RecurrentView GpuSequenceStates::Slot::recurrent(int64_t layer) {
  Layer& L = layers_.at(static_cast<size_t>(layer));
  if (!L.ssm[0]) {
    throw Error("GPU sequence state: layer " + std::to_string(layer) + " is not recurrent");
  }
  RecurrentView v;
  v.conv_in = zero_ ? nullptr : L.conv[cur_].as<float>();
  v.ssm_in = zero_ ? nullptr : L.ssm[cur_].as<float>();
  v.conv_out = L.conv[1 - cur_].as<float>();
  v.ssm_out = L.ssm[1 - cur_].as<float>();
  return v;
}

GpuSequenceStates::GpuSequenceStates(VramBudget& budget, const model::ModelConfig& cfg,
                                     size_t max_sequences)
    : budget_(budget), cfg_(cfg), max_sequences_(max_sequences) {
  slots_.reserve(max_sequences);  // slots are handed out by reference
}

uint64_t GpuSequenceStates::estimate_bytes(const model::ModelConfig& c, int64_t n_ctx,
                                           const model::KvConfig& kv) {
  const model::KvCache cache(c, std::max<int64_t>(n_ctx, 1), kv, model::KvStorage::None);
  uint64_t b = cache.bytes();
  for (int64_t l = 0; l < c.n_layer; ++l) {
    // Double buffered, and one more copy for the prompt cache's checkpoint.
    if (c.is_recurrent(l)) {
      b += 3 * (conv_floats(c) + ssm_floats(c)) * sizeof(float);
    } else if (const int64_t ring = cache.ring_rows(l); ring > 0) {
      b += static_cast<uint64_t>(ring) * (cache.k_row_size(l) + cache.v_row_size(l));  // checkpoint
    }
  }
  return b;
}

std::vector<cuda::DeviceKvLayer> GpuSequenceStates::layout_of(const model::KvCache& cache) const {
  std::vector<cuda::DeviceKvLayer> layout(static_cast<size_t>(cfg_.n_layer));
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    if (cfg_.is_recurrent(l)) continue;
    cuda::DeviceKvLayer& d = layout[static_cast<size_t>(l)];
    d.k_type = model::kv_ggml_type(cache.k_type(l));
    d.v_type = model::kv_ggml_type(cache.v_type(l));
    d.k_rot = cache.k_rotation(l);
    d.v_rot = cache.v_rotation(l);
    d.ring = cache.ring_rows(l);
    for (GgmlType t : {d.k_type, d.v_type}) {
      if (!ggml_row_bytes(t, 32)) {
        throw Error("KV cache type " + ggml_type_label(static_cast<uint32_t>(t)) +
                    " is not supported on the GPU");
      }
    }
  }
  return layout;
}

GpuSequenceStates::Slot& GpuSequenceStates::acquire(const model::KvCache& cache) {
  const model::KvCache* one = &cache;
  return *acquire(std::span<const model::KvCache* const>(&one, 1)).front();
}

std::vector<GpuSequenceStates::Slot*> GpuSequenceStates::acquire(
    std::span<const model::KvCache* const> caches) {
  std::vector<std::vector<cuda::DeviceKvLayer>> layouts;
  layouts.reserve(caches.size());
  for (const model::KvCache* c : caches) layouts.push_back(layout_of(*c));
  // Every sequence's own slot first, before any new sequence of the batch takes one: a new
  // sequence placed first could otherwise evict the state of a continuing one behind it.
  std::vector<Slot*> out(caches.size(), nullptr);
  for (size_t i = 0; i < caches.size(); ++i) {
    const model::KvCache& cache = *caches[i];
    Slot* slot = nullptr;
    for (Slot& s : slots_) {
      if (s.owner_ == &cache) slot = &s;
    }
    if (cache.n_past() != 0) {
      // Continuing: only a sequence evaluated here up to this position has its state here; up to
      // exactly this position for a recurrent state, at least this far for K/V rows alone (a
      // prompt cache keeps a prefix, KvCache::truncate, and the rows past it are written again).
      const bool rewound_kv_only = slot && !cfg_.has_recurrent() && slot->past_ > cache.n_past();
      if (!slot || (slot->past_ != cache.n_past() && !rewound_kv_only)) {
        throw Error(
            "GPU model: the state of this sequence is not in VRAM (a sequence must be evaluated "
            "from position 0 by this model, and at most " +
            std::to_string(max_sequences_) + " sequences are kept)");
      }
    }
    out[i] = slot;
  }
  // Then a slot for each new sequence without one: a free one, else the least recently used one
  // outside this batch. Chosen before any slot is reset, so that running out throws with every
  // slot as it was. (An empty slot created here is free either way.)
  for (size_t i = 0; i < caches.size(); ++i) {
    if (out[i]) continue;
    if (slots_.size() < max_sequences_) {
      out[i] = &slots_.emplace_back();  // reserved: earlier slots do not move
      continue;
    }
    Slot* lru = nullptr;
    for (Slot& s : slots_) {
      if (std::find(out.begin(), out.end(), &s) != out.end()) continue;
      if (!lru || s.last_use_ < lru->last_use_) lru = &s;
    }
    if (!lru) {
      throw Error("GPU model: a batch of " + std::to_string(caches.size()) +
                  " sequences, but VRAM holds the state of at most " +
                  std::to_string(max_sequences_) + " (-np and the health probe's)");
    }
    out[i] = lru;
  }
  ++clock_;
  const auto same = [](const cuda::DeviceKvLayer& a, const cuda::DeviceKvLayer& b) {
    return a.k_type == b.k_type && a.v_type == b.v_type && a.k_rot == b.k_rot &&
           a.v_rot == b.v_rot && a.ring == b.ring;
  };
  for (size_t i = 0; i < caches.size(); ++i) {
    const model::KvCache& cache = *caches[i];
    Slot& slot = *out[i];
    slot.last_use_ = clock_;
    if (cache.n_past() != 0) continue;
    slot.owner_ = &cache;
    slot.past_ = 0;
    slot.zero_ = true;
    // A new sequence (or this one from the start): the old checkpoint is moot.
    slot.ckpt_pos_ = -1;
    std::vector<cuda::DeviceKvLayer>& layout = layouts[i];
    if (slot.layers_.empty() || cache.n_ctx() > slot.ctx_ ||
        !std::equal(layout.begin(), layout.end(), slot.layout_.begin(), slot.layout_.end(), same)) {
      allocate(slot, cache, std::move(layout));
    }
  }
  return out;
}

void GpuSequenceStates::allocate(Slot& s, const model::KvCache& cache,
                                 std::vector<cuda::DeviceKvLayer> layout) {
  ++s.generation_;    // even when an allocation below throws, the old addresses are gone
  s.layers_.clear();  // free before allocating, so the budget sees only the new size
  s.ctx_ = (cache.n_ctx() + 255) / 256 * 256;
  s.layout_ = std::move(layout);
  s.layers_.resize(static_cast<size_t>(cfg_.n_layer));
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    Slot::Layer& L = s.layers_[static_cast<size_t>(l)];
    const std::string ls = std::to_string(l);
    if (cfg_.is_recurrent(l)) {
      s.recurrent_ = true;
      for (int i = 0; i < 2; ++i) {
        L.conv[i] = budget_.allocate(conv_floats(cfg_) * sizeof(float), VramUse::Kv,
                                     "conv state layer " + ls);
        L.ssm[i] = budget_.allocate(ssm_floats(cfg_) * sizeof(float), VramUse::Kv,
                                    "DeltaNet state layer " + ls);
      }
      continue;
    }
    const cuda::DeviceKvLayer& want = s.layout_[static_cast<size_t>(l)];
    const GgmlType kt = want.k_type, vt = want.v_type;
    const int64_t hkv = cfg_.n_head_kv[static_cast<size_t>(l)];
    const int64_t ke = hkv * cfg_.head_dim_k, ve = hkv * cfg_.head_dim_v;
    const size_t kb = kv_row_bytes(kt, ke, "K"), vb = kv_row_bytes(vt, ve, "V");
    // A sliding-window layer keeps only its ring's rows (KvCache::ring_rows).
    const auto rows = static_cast<size_t>(want.ring > 0 ? want.ring : s.ctx_);
    L.k = budget_.allocate(kb * rows, VramUse::Kv, "K cache layer " + ls);
    L.v = budget_.allocate(vb * rows, VramUse::Kv, "V cache layer " + ls);
    L.view = {kt, vt, L.k.get(), L.v.get(),  kb,         vb,
              ke, ve, s.ctx_,    want.k_rot, want.v_rot, want.ring};
  }
}

void GpuSequenceStates::save_checkpoint(const model::KvCache& cache, cudaStream_t stream) {
  Slot* s = nullptr;
  for (Slot& c : slots_) {
    if (c.owner_ == &cache && c.past_ == cache.n_past()) s = &c;
  }
  if (!s) throw Error("GPU model: no state in VRAM to checkpoint for this sequence");
  const size_t conv_bytes = conv_floats(cfg_) * sizeof(float);
  const size_t ssm_bytes = ssm_floats(cfg_) * sizeof(float);
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    Slot::Layer& L = s->layers_[static_cast<size_t>(l)];
    const std::string ls = std::to_string(l);
    if (!cfg_.is_recurrent(l)) {
      // A ring overwrites the rows a later truncation back to here would need.
      if (L.view.ring == 0) continue;
      const size_t kb = ring_bytes(L.view, true), vb = ring_bytes(L.view, false);
      if (!L.ckpt_k) {
        L.ckpt_k = budget_.allocate(kb, VramUse::Kv, "K ring checkpoint layer " + ls);
        L.ckpt_v = budget_.allocate(vb, VramUse::Kv, "V ring checkpoint layer " + ls);
      }
      MOE_CUDA_CHECK(
          cudaMemcpyAsync(L.ckpt_k.get(), L.k.get(), kb, cudaMemcpyDeviceToDevice, stream));
      MOE_CUDA_CHECK(
          cudaMemcpyAsync(L.ckpt_v.get(), L.v.get(), vb, cudaMemcpyDeviceToDevice, stream));
      continue;
    }
    if (!L.ckpt_conv) {
      L.ckpt_conv = budget_.allocate(conv_bytes, VramUse::Kv, "conv checkpoint layer " + ls);
      L.ckpt_ssm = budget_.allocate(ssm_bytes, VramUse::Kv, "DeltaNet checkpoint layer " + ls);
    }
    if (s->zero_) continue;  // the zero state needs no copy
    MOE_CUDA_CHECK(cudaMemcpyAsync(L.ckpt_conv.get(), L.conv[s->cur_].get(), conv_bytes,
                                   cudaMemcpyDeviceToDevice, stream));
    MOE_CUDA_CHECK(cudaMemcpyAsync(L.ckpt_ssm.get(), L.ssm[s->cur_].get(), ssm_bytes,
                                   cudaMemcpyDeviceToDevice, stream));
  }
  s->ckpt_pos_ = s->past_;
  s->ckpt_zero_ = s->zero_;
  s->ckpt_generation_ = s->generation_;
}

bool GpuSequenceStates::restore_checkpoint(const model::KvCache& cache, cudaStream_t stream) {
  Slot* s = nullptr;
  for (Slot& c : slots_) {
    if (c.owner_ == &cache) s = &c;
  }
  // The checkpoint must be this cache's and its rows before it untouched since (same buffers).
  if (!s || s->ckpt_pos_ < 0 || s->ckpt_pos_ != cache.checkpoint_pos() || s->ckpt_pos_ > s->past_ ||
      s->ckpt_generation_ != s->generation_) {
    return false;
  }
  const size_t conv_bytes = conv_floats(cfg_) * sizeof(float);
  const size_t ssm_bytes = ssm_floats(cfg_) * sizeof(float);
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    Slot::Layer& L = s->layers_[static_cast<size_t>(l)];
    if (!cfg_.is_recurrent(l) && L.view.ring > 0) {
      MOE_CUDA_CHECK(cudaMemcpyAsync(L.k.get(), L.ckpt_k.get(), ring_bytes(L.view, true),
                                     cudaMemcpyDeviceToDevice, stream));
      MOE_CUDA_CHECK(cudaMemcpyAsync(L.v.get(), L.ckpt_v.get(), ring_bytes(L.view, false),
                                     cudaMemcpyDeviceToDevice, stream));
    }
    if (!cfg_.is_recurrent(l) || s->ckpt_zero_) continue;
    MOE_CUDA_CHECK(cudaMemcpyAsync(L.conv[s->cur_].get(), L.ckpt_conv.get(), conv_bytes,
                                   cudaMemcpyDeviceToDevice, stream));
    MOE_CUDA_CHECK(cudaMemcpyAsync(L.ssm[s->cur_].get(), L.ckpt_ssm.get(), ssm_bytes,
                                   cudaMemcpyDeviceToDevice, stream));
  }
  s->zero_ = s->ckpt_zero_;
  s->past_ = s->ckpt_pos_;
  return true;
}

void GpuSequenceStates::export_sequence(const model::KvCache& cache, model::SequenceImage& img,
                                        cudaStream_t stream) {
  const int64_t n = cache.n_past();
  const Slot* s = nullptr;
  for (const Slot& c : slots_) {
    if (c.owner_ == &cache) s = &c;
  }
  // As acquire(): K/V rows alone may reach past the position (a kept prefix), a recurrent state
  // must be exactly there.
  if (n > 0 && (!s || s->past_ < n || (cfg_.has_recurrent() && s->past_ != n))) {
    throw Error("GPU model: the state of this sequence is not in VRAM");
  }
  for (int64_t l = 0; l < cfg_.n_layer && n > 0; ++l) {
    const cuda::DeviceKvLayer& d = s->layers_[static_cast<size_t>(l)].view;
    if (!cfg_.is_recurrent(l) &&
        (d.k_row_bytes != cache.k_row_size(l) || d.v_row_bytes != cache.v_row_size(l))) {
      throw Error("GPU model: layer " + std::to_string(l) +
                  "'s K/V rows in VRAM are not of the cache's types");
    }
  }
  img.n_past = n;
  img.layers.assign(static_cast<size_t>(cfg_.n_layer), {});
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    model::SequenceImage::Layer& I = img.layers[static_cast<size_t>(l)];
    if (cfg_.is_recurrent(l)) {
      I.conv.assign(conv_floats(cfg_), 0.0f);
      I.ssm.assign(ssm_floats(cfg_), 0.0f);
    } else {
      const int64_t ring = cache.ring_rows(l);
      const auto rows = static_cast<size_t>(ring > 0 ? std::min(n, ring) : n);
      I.k.resize(rows * cache.k_row_size(l));
      I.v.resize(rows * cache.v_row_size(l));
    }
    if (n == 0) continue;
    const Slot::Layer& L = s->layers_[static_cast<size_t>(l)];
    if (cfg_.is_recurrent(l)) {
      if (s->zero_) continue;
      MOE_CUDA_CHECK(cudaMemcpyAsync(I.conv.data(), L.conv[s->cur_].get(),
                                     I.conv.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                     stream));
      MOE_CUDA_CHECK(cudaMemcpyAsync(I.ssm.data(), L.ssm[s->cur_].get(),
                                     I.ssm.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
      continue;
    }
    const size_t kb = L.view.k_row_bytes, vb = L.view.v_row_bytes;
    for (const RowRun& r : image_runs(L.view, n)) {
      const auto [i, at, m] =
          std::array{static_cast<size_t>(r.image_row), static_cast<size_t>(r.layer_row),
                     static_cast<size_t>(r.n)};
      MOE_CUDA_CHECK(cudaMemcpyAsync(I.k.data() + i * kb, L.k.as<uint8_t>() + at * kb, m * kb,
                                     cudaMemcpyDeviceToHost, stream));
      MOE_CUDA_CHECK(cudaMemcpyAsync(I.v.data() + i * vb, L.v.as<uint8_t>() + at * vb, m * vb,
                                     cudaMemcpyDeviceToHost, stream));
    }
  }
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void GpuSequenceStates::import_sequence(const model::KvCache& cache,
                                        const model::SequenceImage& img, cudaStream_t stream) {
  if (cache.n_past() != 0) {
    throw Error("GPU model: a sequence can only be imported into an empty cache");
  }
  Slot& s = acquire(cache);  // past_ 0: a copy that fails below leaves an empty sequence
  ++s.generation_;           // new contents under recorded addresses: record again
  const int64_t n = img.n_past;
  // Every size before the first copy: nothing is left in flight by a throw.
  bool fits = n >= 0 && n <= s.ctx_ && img.layers.size() == s.layers_.size();
  for (size_t l = 0; fits && l < s.layers_.size(); ++l) {
    const model::SequenceImage::Layer& I = img.layers[l];
    const Slot::Layer& L = s.layers_[l];
    const auto rows = static_cast<size_t>(L.view.ring > 0 ? std::min(n, L.view.ring) : n);
    fits = cfg_.is_recurrent(static_cast<int64_t>(l))
               ? I.conv.size() == conv_floats(cfg_) && I.ssm.size() == ssm_floats(cfg_)
               : I.k.size() == rows * L.view.k_row_bytes && I.v.size() == rows * L.view.v_row_bytes;
  }
  if (!fits) throw Error("GPU model: a sequence image of another shape than this sequence");
  for (int64_t l = 0; l < cfg_.n_layer && n > 0; ++l) {
    const model::SequenceImage::Layer& I = img.layers[static_cast<size_t>(l)];
    Slot::Layer& L = s.layers_[static_cast<size_t>(l)];
    if (cfg_.is_recurrent(l)) {
      MOE_CUDA_CHECK(cudaMemcpyAsync(L.conv[s.cur_].get(), I.conv.data(),
                                     I.conv.size() * sizeof(float), cudaMemcpyHostToDevice,
                                     stream));
      MOE_CUDA_CHECK(cudaMemcpyAsync(L.ssm[s.cur_].get(), I.ssm.data(),
                                     I.ssm.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
      continue;
    }
    const size_t kb = L.view.k_row_bytes, vb = L.view.v_row_bytes;
    for (const RowRun& r : image_runs(L.view, n)) {
      const auto [i, at, m] =
          std::array{static_cast<size_t>(r.image_row), static_cast<size_t>(r.layer_row),
                     static_cast<size_t>(r.n)};
      MOE_CUDA_CHECK(cudaMemcpyAsync(L.k.as<uint8_t>() + at * kb, I.k.data() + i * kb, m * kb,
                                     cudaMemcpyHostToDevice, stream));
      MOE_CUDA_CHECK(cudaMemcpyAsync(L.v.as<uint8_t>() + at * vb, I.v.data() + i * vb, m * vb,
                                     cudaMemcpyHostToDevice, stream));
    }
  }
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  s.past_ = n;
  s.zero_ = n == 0;
  s.ckpt_pos_ = -1;
}

void GpuSequenceStates::shift(const model::KvCache& cache, int64_t n_keep, int64_t n_discard,
                              const float* cs, cudaStream_t stream) {
  Slot* s = nullptr;
  for (Slot& c : slots_) {
    if (c.owner_ == &cache && c.past_ >= cache.n_past()) s = &c;
  }
  if (!s || cfg_.has_recurrent()) throw Error("GPU model: no state in VRAM to shift");
  for (const Slot::Layer& L : s->layers_) {
    if (L.view.ring > 0) {
      throw Error(
          "context shift: the GPU keeps only the last positions of the sliding-window layers "
          "(start with --swa-full to shift the context)");
    }
  }
  int64_t k_elems = 1;
  for (const Slot::Layer& L : s->layers_) k_elems = std::max(k_elems, L.view.k_elems);
  // A chunk of rows at a time (kv_shift), so a small scratch serves any shift.
  const int64_t rows = std::clamp<int64_t>((int64_t{1} << 18) / k_elems, 1, n_discard);
  const size_t floats = static_cast<size_t>(rows * k_elems);
  const VramBuffer scratch =
      budget_.allocate(floats * sizeof(float), VramUse::Scratch, "context shift scratch");
  ++s->generation_;  // the rows change under addresses a graph may have recorded
  s->ckpt_pos_ = -1;
  s->past_ = 0;  // until the shift completed: a failure leaves no usable sequence
  try {
    for (int64_t l = 0; l < cfg_.n_layer; ++l) {
      if (cfg_.is_recurrent(l)) continue;
      cuda::kv_shift(s->layers_[static_cast<size_t>(l)].view, cache.n_past(), n_keep, n_discard,
                     cfg_.head_dim_k, cfg_.n_rot, cs, scratch.as<float>(), floats, stream);
    }
    MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    (void)cudaStreamSynchronize(stream);  // nothing may still use the scratch when it goes
    throw;
  }
  s->past_ = cache.n_past() - n_discard;
}

void GpuSequenceStates::commit(Slot& s, int64_t n_past) {
  s.past_ = n_past;
  // Only recurrent layers read cur_ and zero_, so flipping them for any model is harmless.
  s.cur_ = 1 - s.cur_;
  s.zero_ = false;
}

}  // namespace moe::gpu
