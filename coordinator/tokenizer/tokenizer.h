// Text <-> token ids for GGUF byte-level BPE vocabularies (Qwen3 / Qwen3.5 family), matching
// llama.cpp's llama_tokenize (add_special = false) and llama_detokenize. Thread-safe: all methods
// are const and keep no shared mutable state.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/gguf.h"
#include "coordinator/tokenizer/vocab.h"

namespace moe::tokenizer {

class Tokenizer {
 public:
  // Throws moe::Error for missing or malformed tokenizer metadata.
  static Tokenizer from_gguf(const moe::gguf::GgufFile& f);

  // Special-token text is split out first, longest token first: USER_DEFINED tokens always match
  // (e.g. <think>), CONTROL/UNKNOWN tokens (e.g. <|im_start|>) only when parse_special is set.
  // The text between is pre-tokenized and BPE-merged. Never adds BOS/EOS (see add_bos()).
  // Bytes that are not UTF-8 are tokenized as U+FFFD, as llama.cpp does; encoding never fails.
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;

  // The bytes of one token: NORMAL tokens byte-level decoded, USER_DEFINED tokens as written,
  // CONTROL/UNKNOWN tokens as written when `special` is set and empty otherwise, UNUSED/BYTE
  // tokens empty. May be an incomplete UTF-8 sequence. Throws moe::Error for an invalid id.
  std::string token_piece(int32_t id, bool special) const;

  // Concatenated pieces (unparse_special = render CONTROL tokens). remove_special drops a
  // leading BOS when the vocabulary adds one and a trailing EOS when it adds one (llama.cpp
  // semantics; a no-op for Qwen). Bytes are returned as they are, valid UTF-8 or not.
  std::string decode(std::span<const int32_t> ids, bool remove_special, bool unparse_special) const;

  bool is_eog(int32_t id) const { return vocab_.is_eog(id); }
  int32_t n_vocab() const { return vocab_.n_tokens(); }
  int32_t bos_id() const { return vocab_.special().bos; }  // -1 if none
  int32_t eos_id() const { return vocab_.special().eos; }
  int32_t eot_id() const { return vocab_.special().eot; }
  int32_t pad_id() const { return vocab_.special().pad; }
  bool add_bos() const { return vocab_.add_bos(); }
  const Vocab& vocab() const { return vocab_; }

 private:
  explicit Tokenizer(Vocab v) : vocab_(std::move(v)) {}

  struct Fragment {
    int32_t id;  // special token id, or -1 for raw text
    size_t begin, end;
  };
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

  Vocab vocab_;
};

}  // namespace moe::tokenizer
