// Pre-tokenizers: split text into the pieces BPE merges within, by hand-written matchers for the
// regexes below (leftmost alternative wins at each position, as in a backtracking engine):
//   qwen2:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
//           | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   qwen35: the same with letters [\p{L}\p{M}]+ and the punctuation class also excluding \p{M}.
//   gpt-4o (o200k, gpt-oss): [^\r\n\p{L}\p{N}]?UPPER*LOWER+CONTRACTION?
//           | [^\r\n\p{L}\p{N}]?UPPER+LOWER*CONTRACTION? | \p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n/]*
//           | \s*[\r\n]+ | \s+(?!\S) | \s+
//           with UPPER = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], LOWER = [\p{Ll}\p{Lm}\p{Lo}\p{M}] and
//           CONTRACTION = (?i:'s|'t|'re|'ve|'m|'ll|'d).
// Contractions are case-insensitive over ASCII only, as llama.cpp expands them ('[sS]|'[tT]...).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moe::tokenizer {

enum class PreTokenizer { kQwen2, kQwen35, kGpt4o };

// Appends to `ends` the end index (exclusive, in code points) of each piece of `cps`.
void split_pieces(PreTokenizer pre, std::span<const char32_t> cps, std::vector<size_t>& ends);

// Convenience form over UTF-8 text: the pieces as UTF-8 (bytes that do not decode are U+FFFD).
std::vector<std::string> pretokenize(PreTokenizer pre, std::string_view text);

}  // namespace moe::tokenizer
