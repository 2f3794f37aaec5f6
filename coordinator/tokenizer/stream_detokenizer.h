// Incremental detokenization for streaming output. Tokens can end in the middle of a UTF-8
// character (byte tokens, emoji split over several tokens), so bytes are held back until their
// character completes. Every chunk returned is valid UTF-8: bytes that can never form a character
// (e.g. 0xFF, a lone continuation byte, a sequence cut short by a following byte) are replaced
// with U+FFFD, one per maximal invalid subpart, which is what a lossy UTF-8 decoder (HF
// tokenizers' decode, Python's errors="replace", WHATWG TextDecoder) would show for the whole text.
// Concatenated output therefore equals utf8_lossy(decode(ids)); for valid UTF-8 it equals
// decode(ids) byte for byte.
#pragma once

#include <cstdint>
#include <string>

#include "coordinator/tokenizer/tokenizer.h"

namespace moe::tokenizer {

class StreamDetokenizer {
 public:
  // `special`: render CONTROL tokens (unparse_special). The tokenizer must outlive this object.
  explicit StreamDetokenizer(const Tokenizer& tok, bool special = true)
      : tok_(&tok), special_(special) {}

  // Text completed by this token (possibly empty). Throws moe::Error for an invalid id.
  std::string push(int32_t id);

  // Flushes held bytes (an unfinished character becomes U+FFFD) and resets the stream.
  std::string finish();

 private:
  const Tokenizer* tok_;
  bool special_;
  std::string pending_;  // bytes of an unfinished character
};

}  // namespace moe::tokenizer
