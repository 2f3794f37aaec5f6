// UTF-8 helpers for the tokenizer: a lenient decoder that never fails (what tokenization needs)
// and a strict scanner (what the streaming detokenizer needs to never emit broken text).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace moe::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Appends the code points of `s` to `out`, decoding the way llama.cpp does so that token ids
// match it: only the lead/continuation bit structure is checked (overlong forms and surrogates
// decode as written); a byte that does not start a complete sequence becomes one U+FFFD and
// decoding resumes at the next byte.
void decode_utf8_lenient(std::string_view s, std::vector<char32_t>& out);

// Appends the UTF-8 encoding of `cp` (any value up to 0x1FFFFF, the lenient decoder's range).
void append_utf8(std::string& out, char32_t cp);

// Strict (Unicode Table 3-7) classification of the bytes starting at s[pos].
struct Utf8Step {
  enum Kind { kComplete, kInvalid, kTruncated } kind;
  // kComplete: sequence length; kInvalid: length of the maximal invalid subpart (>= 1);
  // kTruncated: bytes to the end of s, a valid prefix of a character that may still complete.
  size_t len;
};
Utf8Step scan_utf8(std::string_view s, size_t pos);

bool is_valid_utf8(std::string_view s);

// Strict decoding with each maximal invalid subpart replaced by U+FFFD (WHATWG / Python
// "replace" behaviour). A truncated sequence at the end also becomes one U+FFFD.
std::string utf8_lossy(std::string_view s);

}  // namespace moe::tokenizer
