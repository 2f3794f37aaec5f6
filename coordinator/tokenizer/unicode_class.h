// Unicode character classes the pre-tokenizer regexes use, with the regex engines' semantics
// (Rust regex / Oniguruma, which HF tokenizers use and llama.cpp reproduces):
//   \p{L}  general category L (Lu Ll Lt Lm Lo); gpt-4o's letter runs split it by case:
//          [\p{Lu}\p{Lt}\p{Lm}\p{Lo}] (kUpperOrCaseless) and [\p{Ll}\p{Lm}\p{Lo}]
//          (kLowerOrCaseless)
//   \p{N}  general category N (Nd Nl No), so superscripts and fractions count as numbers
//   \p{M}  general category M (Mn Mc Me)
//   \s     the White_Space property (not C isspace: U+001C..U+001F are not whitespace, U+0085,
//          U+00A0, U+2000..U+200A, U+3000 ... are)
#pragma once

#include <cstdint>

namespace moe::tokenizer {

enum CharClass : uint8_t {
  kLetter = 1,
  kNumber = 2,
  kMark = 4,
  kSpace = 8,
  kCrLf = 16,             // '\r' or '\n' (also kSpace)
  kUpperOrCaseless = 32,  // Lu Lt Lm Lo
  kLowerOrCaseless = 64,  // Ll Lm Lo
};

// Bit set of CharClass values. Code points above U+10FFFF (possible after lenient UTF-8 decoding)
// and unassigned ones have none.
uint8_t char_class(char32_t cp);

}  // namespace moe::tokenizer
