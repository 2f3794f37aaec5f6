// llama-server's slot files (--slot-save-path, POST /slots/{id}?action=save|restore): one slot's
// tokens and sequence state, so that a conversation's prompt cache outlives the slot, the process
// or the machine. The state is written as the cache stores it; a file restores only into the same
// model (the same weights) with the same cache types, and everything is checked before anything
// is read into a slot.
//
// Format (version 1), little-endian, no padding:
//   magic        8 bytes  "MOESLOT\0"
//   version      u32      1
//   fingerprint           what the state is only meaningful for:
//     arch       u32 length (1..64), then the bytes of general.architecture
//     weights    u64      weights_hash(): FNV-1a over the tensor table (names, types, shapes), so
//                         another model or quantization of the same shapes is told apart
//     n_layer, n_embd, n_vocab, head_dim_k, head_dim_v       u32 each
//     conv_floats, ssm_floats   u32 each: one recurrent layer's conv window and DeltaNet matrices
//                               (0 without recurrent layers)
//     per layer, n_layer times, 16 bytes:
//       recurrent u8 (0/1), k_type u8, v_type u8 (ggml type ids; 0 for a recurrent layer), 0 u8,
//       n_head_kv u32, k_rot u32, v_rot u32 (the Hadamard blocks; 0: not rotated)
//   n_tokens     u32      at most the slot's context
//   tokens       n_tokens x i32
//   state        for each attention layer in order: K rows [0, n_tokens), then V rows, each row
//                in its cache type's bytes as stored (rotated where the layer rotates); then for
//                each recurrent layer in order: its conv window, then its DeltaNet matrices (f32)
// The file's size is exactly what the fingerprint and n_tokens say.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/model/kv_cache.h"
#include "coordinator/model/sequence_image.h"
#include "experts/model_config.h"

namespace moe::engine {

// Why a slot file could not be used: Invalid (a bad name, another model's file, a corrupt or
// truncated one: the request's fault), NotFound (no such file), Io (the disk: the server's).
class SlotFileError : public Error {
 public:
  enum Kind { Invalid, NotFound, Io };
  SlotFileError(Kind kind, const std::string& what) : Error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

struct SlotFingerprint {
  struct Layer {
    bool recurrent = false;
    uint32_t k_type = 0, v_type = 0;  // ggml type ids
    uint32_t n_head_kv = 0, k_rot = 0, v_rot = 0;
    uint64_t k_row_bytes = 0, v_row_bytes = 0;  // derived, not stored
  };
  std::string arch;
  uint64_t weights = 0;
  uint32_t n_layer = 0, n_embd = 0, n_vocab = 0, head_dim_k = 0, head_dim_v = 0;
  uint32_t conv_floats = 0, ssm_floats = 0;
  std::vector<Layer> layers;

  // This model's with `layout`'s cache types and rotation (any storage, any n_ctx).
  static SlotFingerprint of(const model::ModelConfig& cfg, const model::KvCache& layout,
                            uint64_t weights);
  // Bytes of the state of n tokens.
  uint64_t state_bytes(uint64_t n_tokens) const;
};

// FNV-1a 64 of every tensor's name, type and shape, in file order.
uint64_t weights_hash(const gguf::GgufFile& file);

// llama-server's rule for the name in a request: 1..255 printable ASCII characters, none of
// / \ : * ? " < > |, no leading '.' or space, no trailing space or '.', no "..". SlotFileError
// (Invalid) saying what is wrong.
void check_slot_filename(std::string_view name);

// Writes the file whole or not at all (a temporary beside it, renamed into place); returns its
// size. SlotFileError (Io) when the disk refuses.
uint64_t write_slot_file(const std::filesystem::path& path, const SlotFingerprint& fp,
                         std::span<const int32_t> tokens, const model::SequenceImage& image);

struct SlotContents {
  std::vector<int32_t> tokens;
  model::SequenceImage image;
  uint64_t bytes = 0;  // the file's size
};

// Reads and checks everything (magic, version, fingerprint equal to `expect`, naming the first
// difference; n_tokens <= n_ctx; the exact size; token ids below n_vocab) before the state is
// read; SlotFileError otherwise.
SlotContents read_slot_file(const std::filesystem::path& path, const SlotFingerprint& expect,
                            int64_t n_ctx);

}  // namespace moe::engine
