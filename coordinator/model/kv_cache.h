// Per-sequence state: for every attention layer, K and V rows (one row of n_head_kv * head_dim
// values per position) stored as f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1 or iq4_nl
// (llama.cpp's -ctk/-ctv names and block layouts), per layer (KvConfig), quantized rows
// Hadamard-rotated as llama.cpp does by default; for every recurrent layer of a hybrid model
// (qwen35moe), its RecurrentState. One object per sequence, so several sequences are several
// caches.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/ggml_type.h"
#include "coordinator/model/recurrent_state.h"
#include "coordinator/model/sequence_image.h"
#include "experts/model_config.h"

namespace moe::model {

enum class KvType { F32, F16, Q8_0, Q4_0, BF16, Q4_1, Q5_0, Q5_1, IQ4_NL };

// Where a cache keeps its K/V rows and recurrent state. A GPU forward keeps them in VRAM and uses
// the host cache only as the sequence's identity and position count: None allocates nothing on
// the host (an f16 cache of qwen3-30b at 32k positions would otherwise hold 3 GB of unused RAM).
enum class KvStorage { Host, None };

// "f32", "f16", "bf16", "q8_0", "q5_0", "q5_1", "q4_0", "q4_1", "iq4_nl"; anything else throws
// moe::Error.
KvType parse_kv_type(std::string_view name);
std::string_view kv_type_name(KvType t);
GgmlType kv_ggml_type(KvType t);
bool kv_type_quantized(KvType t);

// The cache types of every attention layer: -ctk/-ctv for all, with the first or last N attention
// layers (counted among attention layers only) given another type by -ctk-first TYPE,N,
// -ctk-last, -ctv-first, -ctv-last (the reference user's fork; "last" wins where both reach).
// Quantized K and V are rotated (llama.cpp b10587's default, --no-kv-rotation turns it off): K and
// the query in blocks of the largest power of two >= 64 dividing the head size, V (and the
// attention output back) in blocks of 64; head sizes that are not multiples of 64 are not rotated.
// Sliding-window layers (gpt-oss) of a host cache keep only their last window + swa_slack positions
// in a ring (llama.cpp's SWA cache holds the window + one ubatch likewise; the server passes its
// batch size), unless swa_full (llama.cpp's --swa-full) or the context is no longer anyway.
struct KvConfig {
  struct Override {
    KvType type;
    int64_t n_layers;
  };
  KvType k = KvType::F16, v = KvType::F16;
  std::optional<Override> k_first, k_last, v_first, v_last;
  bool rotate = true;
  bool swa_full = false;
  int64_t swa_slack = 512;

  static KvConfig uniform(KvType k, KvType v) {
    KvConfig c;
    c.k = k;
    c.v = v;
    return c;
  }
  // The types of attention layer `index` of n_attention.
  KvType k_type(int64_t index, int64_t n_attention) const;
  KvType v_type(int64_t index, int64_t n_attention) const;
  // "TYPE,N" as the -ctk-first family spells it; moe::Error naming `flag` otherwise.
  static Override parse_override(std::string_view spec, std::string_view flag);
};

class KvCache {
 public:
  // Storage for n_ctx positions of every attention layer of `cfg` (recurrent layers keep no K/V)
  // and the recurrent state (none with KvStorage::None: then every access to them throws). Throws
  // moe::Error when n_ctx < 1 or a row does not split into whole blocks of the chosen type.
  KvCache(const ModelConfig& cfg, int64_t n_ctx, const KvConfig& kv,
          KvStorage storage = KvStorage::Host);
  KvCache(const ModelConfig& cfg, int64_t n_ctx, KvType k_type, KvType v_type,
          KvStorage storage = KvStorage::Host)
      : KvCache(cfg, n_ctx, KvConfig::uniform(k_type, v_type), storage) {}

  int64_t n_ctx() const { return n_ctx_; }
  // Positions already evaluated (the next token goes at n_past()).
  int64_t n_past() const { return n_past_; }
  // The types of an attention layer (of the first attention layer: k_type(), v_type()).
  KvType k_type(int64_t layer) const { return layer_at(layer).k_type; }
  KvType v_type(int64_t layer) const { return layer_at(layer).v_type; }
  KvType k_type() const { return k_type(first_attention_); }
  KvType v_type() const { return v_type(first_attention_); }
  // The Hadamard block K (with the query) and V (with the attention output) of a layer are
  // rotated in; 0: not rotated.
  int64_t k_rotation(int64_t layer) const { return layer_at(layer).k_rot; }
  int64_t v_rotation(int64_t layer) const { return layer_at(layer).v_rot; }
  // Bytes of K and V rows for n_ctx positions over every layer, at their real types.
  uint64_t bytes() const;
  // "f16 K / q4_0 V, layers 0-3 q8_0 V, ..., rotated" for start-up lines and /props.
  std::string describe() const;
  KvStorage storage() const { return storage_; }
  int64_t k_row_elems(int64_t layer) const { return layers_[static_cast<size_t>(layer)].k_elems; }
  int64_t v_row_elems(int64_t layer) const { return layers_[static_cast<size_t>(layer)].v_elems; }

  // Throws "context length N exceeded" unless n more positions fit after n_past().
  void check_room(int64_t n) const;

  // A sliding-window layer's ring: position p lives in row p % ring_rows(layer), and only the last
  // ring_rows positions are kept; 0 for a layer that keeps every position.
  int64_t ring_rows(int64_t layer) const { return layer_at(layer).ring; }
  // The most tokens one store-then-attend step of a layer may take: a ring must still hold the
  // window of its first token after storing them all (n_ctx for other layers).
  int64_t max_step(int64_t layer) const;
  // Whether the prompt cache needs checkpoints to go back: a recurrent state, or a ring that keeps
  // only the last positions (truncate() can go back only a little, can_truncate_to says how far).
  bool needs_checkpoints() const { return recurrent_ || ring_slack_ > 0; }

  // Writes the K and V rows of position `pos` (rotated where the layer rotates, then converted to
  // the cache types); throws for a recurrent layer.
  void store(int64_t layer, int64_t pos, const float* k_row, const float* v_row);

  // Direct f32 rows [0, n_ctx) of a layer when the type is F32 and it keeps every position, else
  // nullptr.
  const float* k_f32(int64_t layer) const;
  const float* v_f32(int64_t layer) const;
  // Decodes the rows of positions [pos, pos + n) into dst (n * row_elems floats), as stored (still
  // rotated); on a ring, n <= ring_rows and the positions the last ring_rows stored.
  void read_k(int64_t layer, int64_t pos, int64_t n, float* dst) const;
  void read_v(int64_t layer, int64_t pos, int64_t n, float* dst) const;
  // The stored bytes of position pos's K / V row of an attention layer (host storage; on a ring
  // the row it shares with the positions ring_rows apart), for the context shift (kv_shift.h),
  // which moves rows as bytes and re-encodes K.
  std::span<uint8_t> k_row_data(int64_t layer, int64_t pos);
  std::span<uint8_t> v_row_data(int64_t layer, int64_t pos);
  // The context shift's bookkeeping, whatever the storage: positions [n_keep, n_keep + n) are gone
  // and the later ones moved down (n_past() drops by n), the checkpoint with them. moe::Error,
  // nothing changed, unless 0 <= n_keep, n >= 1, n_keep + n <= n_past() and the model has no
  // recurrent layers (their state holds every position and cannot drop some).
  void drop_positions(int64_t n_keep, int64_t n);

  // The recurrent layers' state (read the committed buffers, write the others); throws
  // moe::Error for a layer without one. A cache without host storage has none.
  bool has_recurrent(int64_t layer) const { return rs_.has_layer(layer); }
  // Whether the model has recurrent layers (whose state cannot be rewound by truncate()).
  bool has_recurrent_state() const { return recurrent_; }
  RecurrentState::LayerView recurrent(int64_t layer) { return rs_.layer(layer); }

  // Marks n more positions as evaluated and commits the recurrent state they wrote (after a whole
  // batch succeeded).
  void advance(int64_t n);
  // Forgets every position and resets the recurrent state to zero (the storage is kept).
  void clear() {
    n_past_ = 0;
    written_ = 0;
    checkpoint_pos_ = -1;
    rs_.reset();
  }
  // Whether truncate(n) may keep the first n positions: attention K/V rows past n are simply
  // written again, but a recurrent state holds every position it saw and cannot be rewound, so a
  // hybrid model's cache keeps all its positions or none; a ring goes back at most its slack
  // (the rows of the window before n are still there), counted from the furthest position stored
  // since: rows past n_past() that a truncation left in a ring still overwrote older ones.
  bool can_truncate_to(int64_t n) const {
    if (n < 0 || n > n_past_) return false;
    if (n == n_past_ || n == 0) return true;
    return !recurrent_ && (ring_slack_ == 0 || written_ - n <= ring_slack_);
  }
  // Keeps positions [0, n) (the prompt cache's common prefix); moe::Error unless can_truncate_to.
  void truncate(int64_t n);

  // A checkpoint of the sequence at n_past() (the prompt cache of a hybrid model, whose recurrent
  // state cannot be rewound, or of one with rings): with host storage the recurrent state and the
  // rings are copied here; a GPU model keeps its copy in VRAM and this records the position.
  // Replaces the previous checkpoint.
  void save_checkpoint();
  // The checkpoint's position, or -1 (none, or lost to a truncation before it).
  int64_t checkpoint_pos() const { return checkpoint_pos_; }
  // Back to the checkpoint: n_past() becomes its position and (host storage) the recurrent state
  // its copy; moe::Error without a checkpoint.
  void restore_checkpoint();

  // Slot files (coordinator/engine/slot_file.h): the sequence as plain bytes (SequenceImage).
  // Bytes of one K / V row of a layer (0 for a recurrent layer), and the floats of one recurrent
  // layer's conv window and DeltaNet matrices (0 without recurrent layers), whatever the storage.
  size_t k_row_size(int64_t layer) const { return layer_at(layer).k_row_bytes; }
  size_t v_row_size(int64_t layer) const { return layer_at(layer).v_row_bytes; }
  int64_t conv_floats() const { return conv_floats_; }
  int64_t ssm_floats() const { return ssm_floats_; }
  // moe::Error naming the first difference unless `image` fits this cache: a layer entry per
  // layer, n_past within n_ctx, rows [0, n_past) at this cache's row sizes (a ring layer: the last
  // min(n_past, ring_rows) of them), the recurrent shapes.
  void check_image(const SequenceImage& image) const;
  // Rows [0, n_past()) (a ring layer: its last min(n_past, ring_rows)) and the committed recurrent
  // state, copied out (host storage).
  void export_image(SequenceImage& image) const;
  // check_image (nothing changes when it throws), then copies it in: n_past() = image.n_past,
  // no checkpoint (host storage).
  void import_image(const SequenceImage& image);
  // A cache without host storage whose state a GPU forward put in VRAM: n_past() = n, no
  // checkpoint. moe::Error for host storage (import_image) or n outside [0, n_ctx].
  void restore(int64_t n);

 private:
  void require_host(const char* what) const;  // throws for KvStorage::None
  struct Layer {
    KvType k_type = KvType::F32, v_type = KvType::F32;
    int64_t k_rot = 0, v_rot = 0;
    int64_t k_elems = 0, v_elems = 0;
    size_t k_row_bytes = 0, v_row_bytes = 0;
    int64_t ring = 0;  // rows of a sliding-window layer's ring; 0: n_ctx rows, one per position
    int64_t n_swa = 0;
    std::vector<unsigned char> k, v;
    size_t row(int64_t pos) const { return static_cast<size_t>(ring > 0 ? pos % ring : pos); }
  };
  const Layer& layer_at(int64_t layer) const;
  // Image rows of a layer at n_past positions: n_past, or for a ring the last min(n_past, ring).
  static int64_t image_rows(const Layer& L, int64_t n_past);
  int64_t n_ctx_;
  int64_t n_past_ = 0;
  int64_t first_attention_ = 0;
  KvStorage storage_;
  std::vector<float> rotated_;  // store()'s rotated copy of a row
  int64_t checkpoint_pos_ = -1;
  int64_t written_ = 0;  // the furthest position stored since clear(), + 1 (truncate's bound)
  int64_t checkpoint_written_ = 0;
  RecurrentState::Snapshot checkpoint_;
  std::vector<std::vector<unsigned char>> checkpoint_rings_;  // per ring layer: K then V bytes
  int64_t ring_slack_ = 0;  // how far back truncate() may go on the rings (0: no rings)
  bool recurrent_ = false;  // the model has recurrent layers (wherever their state lives)
  std::vector<Layer> layers_;
  RecurrentState rs_;
  int64_t conv_floats_ = 0, ssm_floats_ = 0;  // per recurrent layer
};

}  // namespace moe::model
