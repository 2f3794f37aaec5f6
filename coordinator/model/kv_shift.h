// Context shift (llama-server's --context-shift): when a sequence's context is full, positions
// [n_keep, n_keep + n_discard) are dropped and [n_keep + n_discard, n_past) move down by
// n_discard. K rows are stored after RoPE, and RoPE rotations compose (angle θ(p) then θ(-d) is
// θ(p - d)), so a moved K row is rotated by -n_discard positions; a Hadamard-rotated (quantized)
// K row is decoded, rotated back (the normalized transform is its own inverse), re-roped, rotated
// and re-encoded, byte for byte what KvCache::store writes for those floats. V rows move as bytes.
// A recurrent state (qwen35moe's DeltaNet layers) holds every position it saw and cannot shift.
#pragma once

#include <cstdint>
#include <vector>

#include "coordinator/model/kv_cache.h"
#include "experts/model_config.h"
#include "kernels/cpu/rope.h"

namespace moe::model {

// moe::Error unless the shift is possible: a model without recurrent layers whose K heads RoPE
// can rotate (an even n_rot <= head_dim_k), 0 <= n_keep, n_discard >= 1 and
// n_keep + n_discard <= cache.n_past().
void check_shift(const KvCache& cache, const ModelConfig& cfg, int64_t n_keep, int64_t n_discard);

// The RoPE scaling of `cfg` (none, linear, YaRN) as rope_angles_yarn takes it: what the forward
// ropes q and k with.
RopeYarn rope_params(const ModelConfig& cfg);

// The cos/sin table (rope_angles' layout, n_rot floats) that moves a K row n_discard positions
// back: the angles of position -n_discard (with a YaRN model's frequencies but without its
// magnitude factor, which the stored row already carries). The GPU shift takes the host's table so
// that both shifts agree to the bit (device cosf/sinf differ from the host's by an ulp).
std::vector<float> shift_angles(const ModelConfig& cfg, int64_t n_discard);

// The shift on a cache with host storage: rows moved (K re-roped), then
// KvCache::drop_positions. check_shift first: moe::Error with nothing changed.
void shift_kv(KvCache& cache, const ModelConfig& cfg, int64_t n_keep, int64_t n_discard);

}  // namespace moe::model
