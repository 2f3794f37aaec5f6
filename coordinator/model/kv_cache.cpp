#include "coordinator/model/kv_cache.h"

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/fp16.h"
#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/dequant.h"

namespace moe::model {
namespace {

// Q4_0 as llama.cpp's quantize_row_q4_0_ref: the signed value of largest magnitude maps to -8.
void quantize_q4_0(const float* x, unsigned char* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    unsigned char* out = dst + b * 18;
    const uint16_t dh = fp32_to_fp16(d);
    std::memcpy(out, &dh, 2);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(xb[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(xb[j + 16] * id + 8.5f));
      out[2 + j] = static_cast<unsigned char>(q0 | (q1 << 4));
    }
  }
}

void encode_row(KvType t, const float* x, unsigned char* dst, int64_t n) {
  switch (t) {
    case KvType::F32:
      std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case KvType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(x[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case KvType::Q8_0:
      // The Q8_0 weight block and the Q8_0 activation block are the same format.
      cpu::quantize_act_row_ref(cpu::ActFormat::Q8_0, x, dst, n);
      return;
    case KvType::Q4_0:
      quantize_q4_0(x, dst, n);
      return;
  }
}

}  // namespace

KvType parse_kv_type(std::string_view name) {
  if (name == "f32") return KvType::F32;
  if (name == "f16") return KvType::F16;
  if (name == "q8_0") return KvType::Q8_0;
  if (name == "q4_0") return KvType::Q4_0;
  throw Error("unsupported KV cache type '" + std::string(name) +
              "' (supported: f32, f16, q8_0, q4_0)");
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
  }
  return GgmlType::F32;
}

KvCache::KvCache(const ModelConfig& cfg, int64_t n_ctx, KvType k_type, KvType v_type,
                 KvStorage storage)
    : n_ctx_(n_ctx), k_type_(k_type), v_type_(v_type), storage_(storage) {
  if (n_ctx < 1 || n_ctx > (int64_t{1} << 24)) {
    throw Error("invalid context length " + std::to_string(n_ctx));
  }
  layers_.resize(static_cast<size_t>(cfg.n_layer));
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    if (cfg.is_recurrent(l)) continue;
    Layer& L = layers_[static_cast<size_t>(l)];
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
    if (storage == KvStorage::None) continue;
    L.k.resize(L.k_row_bytes * static_cast<size_t>(n_ctx));
    L.v.resize(L.v_row_bytes * static_cast<size_t>(n_ctx));
  }
  if (!cfg.recurrent.empty() && storage == KvStorage::Host) rs_ = RecurrentState(cfg);
  recurrent_ = cfg.has_recurrent();
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
  encode_row(k_type_, k_row, L.k.data() + static_cast<size_t>(pos) * L.k_row_bytes, L.k_elems);
  encode_row(v_type_, v_row, L.v.data() + static_cast<size_t>(pos) * L.v_row_bytes, L.v_elems);
}

const float* KvCache::k_f32(int64_t layer) const {
  require_host("reading K");
  if (k_type_ != KvType::F32) return nullptr;
  return reinterpret_cast<const float*>(layers_.at(static_cast<size_t>(layer)).k.data());
}

const float* KvCache::v_f32(int64_t layer) const {
  require_host("reading V");
  if (v_type_ != KvType::F32) return nullptr;
  return reinterpret_cast<const float*>(layers_.at(static_cast<size_t>(layer)).v.data());
}

void KvCache::read_k(int64_t layer, int64_t pos, int64_t n, float* dst) const {
  require_host("reading K");
  const Layer& L = layers_.at(static_cast<size_t>(layer));
  for (int64_t i = 0; i < n; ++i) {
    cpu::dequantize_row(kv_ggml_type(k_type_),
                        L.k.data() + static_cast<size_t>(pos + i) * L.k_row_bytes,
                        dst + i * L.k_elems, L.k_elems);
  }
}

void KvCache::read_v(int64_t layer, int64_t pos, int64_t n, float* dst) const {
  require_host("reading V");
  const Layer& L = layers_.at(static_cast<size_t>(layer));
  for (int64_t i = 0; i < n; ++i) {
    cpu::dequantize_row(kv_ggml_type(v_type_),
                        L.v.data() + static_cast<size_t>(pos + i) * L.v_row_bytes,
                        dst + i * L.v_elems, L.v_elems);
  }
}

void KvCache::advance(int64_t n) {
  check_room(n);
  n_past_ += n;
  if (n > 0) rs_.commit();
}

}  // namespace moe::model
