#include "coordinator/model/kv_shift.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>

#include "common/error.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/hadamard.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/rope.h"

namespace moe::model {

void check_shift(const KvCache& cache, const ModelConfig& cfg, int64_t n_keep, int64_t n_discard) {
  if (cfg.has_recurrent()) {
    throw Error("context shift: " + cfg.arch +
                " has recurrent layers, whose state cannot drop positions");
  }
  if (cfg.n_rot < 2 || cfg.n_rot % 2 != 0 || cfg.n_rot > cfg.head_dim_k) {
    throw Error("context shift: rope dimension " + std::to_string(cfg.n_rot) +
                " does not fit K heads of " + std::to_string(cfg.head_dim_k));
  }
  if (n_keep < 0 || n_discard < 1 || n_keep > cache.n_past() - n_discard) {
    throw Error("context shift: cannot drop " + std::to_string(n_discard) + " positions after " +
                std::to_string(n_keep) + " of " + std::to_string(cache.n_past()));
  }
}

RopeYarn rope_params(const ModelConfig& cfg) {
  if (cfg.rope_scaling == RopeScaling::None) return {};
  return rope_yarn_params(cfg.n_rot, cfg.rope_freq_base, cfg.rope_scaling_factor,
                          cfg.rope_n_ctx_orig, cfg.yarn_beta_fast, cfg.yarn_beta_slow,
                          cfg.rope_attn_factor, cfg.rope_scaling == RopeScaling::Yarn);
}

std::vector<float> shift_angles(const ModelConfig& cfg, int64_t n_discard) {
  std::vector<float> cs(static_cast<size_t>(cfg.n_rot));
  if (cfg.rope_scaling == RopeScaling::None) {
    rope_angles(-n_discard, cfg.n_rot, cfg.rope_freq_base, cs.data());
  } else {
    RopeYarn y = rope_params(cfg);
    y.mscale = 1.0f;  // a pure rotation: the stored row keeps its magnitude
    rope_angles_yarn(-n_discard, cfg.n_rot, cfg.rope_freq_base, y, cs.data());
  }
  return cs;
}

namespace {

// Re-ropes one K row in place (decoded, un-rotated, rotated by cs, rotated back, encoded).
void rerope_k(KvCache& cache, const ModelConfig& cfg, int64_t l, std::span<uint8_t> row,
              const float* cs, std::vector<float>& k) {
  const GgmlType type = kv_ggml_type(cache.k_type(l));
  const int64_t elems = cache.k_row_elems(l), rot = cache.k_rotation(l);
  k.resize(static_cast<size_t>(elems));
  cpu::dequantize_row(type, row.data(), k.data(), elems);
  if (rot) cpu::hadamard_blocks(k.data(), elems, rot);
  rope_neox(k.data(), elems / cfg.head_dim_k, cfg.head_dim_k, cfg.n_rot, cs);
  if (rot) cpu::hadamard_blocks(k.data(), elems, rot);
  cpu::encode_kv_row(type, k.data(), row.data(), elems);
}

// A sliding-window ring keeps only its last R positions: after the shift it needs the rows of
// the new positions [newN - R, newN). Those from n_keep on come from n_discard later, all still
// in the ring; they are copied aside first, since a destination row may be a source's.
void shift_ring(KvCache& cache, int64_t l, int64_t n_keep, int64_t n_discard,
                const ModelConfig& cfg, const float* cs) {
  const int64_t R = cache.ring_rows(l), n_past = cache.n_past(), new_n = n_past - n_discard;
  const int64_t first = std::max<int64_t>(0, new_n - R);
  if (first < n_keep && first < n_past - R) {
    throw Error("context shift: layer " + std::to_string(l) + "'s sliding-window ring no longer " +
                "holds the kept positions its window needs (--swa-full keeps them all)");
  }
  const size_t kb = cache.k_row_size(l), vb = cache.v_row_size(l);
  const int64_t from = std::max(first, n_keep);
  std::vector<uint8_t> rows(static_cast<size_t>(new_n - from) * (kb + vb));
  for (int64_t q = from; q < new_n; ++q) {
    uint8_t* dst = rows.data() + static_cast<size_t>(q - from) * (kb + vb);
    const std::span<uint8_t> k = cache.k_row_data(l, q + n_discard);
    const std::span<uint8_t> v = cache.v_row_data(l, q + n_discard);
    std::memcpy(dst, k.data(), kb);
    std::memcpy(dst + kb, v.data(), vb);
  }
  std::vector<float> k;
  for (int64_t q = from; q < new_n; ++q) {
    const uint8_t* src = rows.data() + static_cast<size_t>(q - from) * (kb + vb);
    const std::span<uint8_t> kd = cache.k_row_data(l, q);
    std::memcpy(kd.data(), src, kb);
    std::memcpy(cache.v_row_data(l, q).data(), src + kb, vb);
    rerope_k(cache, cfg, l, kd, cs, k);
  }
}

}  // namespace

void shift_kv(KvCache& cache, const ModelConfig& cfg, int64_t n_keep, int64_t n_discard) {
  check_shift(cache, cfg, n_keep, n_discard);
  if (cache.storage() != KvStorage::Host) {
    throw Error("context shift: this cache keeps its rows in VRAM (the GPU forward shifts them)");
  }
  const std::vector<float> cs = shift_angles(cfg, n_discard);
  const int64_t n_move = cache.n_past() - n_keep - n_discard;
  std::vector<float> k;
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    if (cfg.is_recurrent(l)) continue;
    if (cache.ring_rows(l) > 0) {
      shift_ring(cache, l, n_keep, n_discard, cfg, cs.data());
      continue;
    }
    // Upwards: row i goes to i - n_discard, below every row still to be read.
    for (int64_t src = n_keep + n_discard; src < n_keep + n_discard + n_move; ++src) {
      const int64_t dst = src - n_discard;
      const std::span<uint8_t> kd = cache.k_row_data(l, dst);
      std::memcpy(kd.data(), cache.k_row_data(l, src).data(), kd.size());
      rerope_k(cache, cfg, l, kd, cs.data(), k);
      const std::span<uint8_t> v = cache.v_row_data(l, src);
      std::memcpy(cache.v_row_data(l, dst).data(), v.data(), v.size());
    }
  }
  cache.drop_positions(n_keep, n_discard);
}

}  // namespace moe::model
