// A byte-level BPE vocabulary loaded from GGUF `tokenizer.ggml.*` metadata (a vocab-only file is
// enough): token texts and types, merge ranks, special ids and the end-of-generation set.
// Everything is validated at load; bad metadata throws moe::Error naming the key and the entry.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/gguf.h"
#include "coordinator/tokenizer/pretokenize.h"

namespace moe::tokenizer {

enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Special ids; -1 when the vocabulary has none.
struct SpecialIds {
  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1, sep = -1;
  int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
};

class Vocab {
 public:
  static Vocab from_gguf(const moe::gguf::GgufFile& f);

  // Move-only: the text index points into the token storage.
  Vocab(Vocab&&) noexcept = default;
  Vocab& operator=(Vocab&&) noexcept = default;
  Vocab(const Vocab&) = delete;
  Vocab& operator=(const Vocab&) = delete;

  int32_t n_tokens() const { return static_cast<int32_t>(types_.size()); }
  bool valid_id(int32_t id) const { return id >= 0 && id < n_tokens(); }
  // Token text as stored (byte-level encoded for NORMAL tokens, raw for added tokens).
  std::string_view text(int32_t id) const {
    return {blob_.data() + offsets_[id], offsets_[id + 1] - offsets_[id]};
  }
  TokenType type(int32_t id) const { return types_[id]; }
  int32_t find(std::string_view text) const;  // -1 if absent
  // Token of a single raw byte (its byte-level character); always present after validation.
  int32_t byte_token(uint8_t b) const { return byte_tokens_[b]; }

  struct Merge {
    int32_t rank = -1;    // -1: no such merge
    int32_t result = -1;  // token id of left+right
  };
  Merge find_merge(int32_t left, int32_t right) const;
  size_t n_merges() const { return n_merges_; }

  const SpecialIds& special() const { return special_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog_ids() const { return eog_; }  // sorted

  PreTokenizer pre() const { return pre_; }
  const std::string& pre_name() const { return pre_name_; }

  // CONTROL, USER_DEFINED and UNKNOWN tokens with non-empty text, longest text first (ties: lower
  // id first): the candidates for splitting special-token text out before BPE.
  const std::vector<int32_t>& special_candidates() const { return special_candidates_; }

 private:
  void load_tokens(const moe::gguf::GgufFile& f);
  void load_merges(const moe::gguf::GgufFile& f);
  void load_special_ids(const moe::gguf::GgufFile& f);
  void build_eog();

  // Open-addressing table keyed by (left id, right id): built once, read-only afterwards.
  struct MergeSlot {
    uint64_t key = ~0ull;
    Merge merge;
  };
  std::vector<MergeSlot> merges_;
  size_t n_merges_ = 0;

  Vocab() = default;

  std::vector<char> blob_;  // all token texts back to back (a vector keeps its buffer on move)
  std::vector<uint32_t> offsets_;  // n_tokens + 1
  std::vector<TokenType> types_;
  // Open-addressing text -> id index (std::unordered_map made loading 3x slower).
  struct TextSlot {
    uint32_t tag = 0;  // high hash bits: skips most string compares
    int32_t id = -1;   // -1: empty
  };
  std::vector<TextSlot> by_text_;
  int32_t byte_tokens_[256] = {};
  SpecialIds special_;
  bool add_bos_ = false;
  bool add_eos_ = false;
  std::vector<int32_t> eog_;
  PreTokenizer pre_ = PreTokenizer::kQwen2;
  std::string pre_name_;
  std::vector<int32_t> special_candidates_;
};

}  // namespace moe::tokenizer
