#include "coordinator/tokenizer/pretokenize.h"

#include "coordinator/tokenizer/unicode_class.h"
#include "coordinator/tokenizer/utf8.h"

namespace moe::tokenizer {
namespace {

class Matcher {
 public:
  Matcher(PreTokenizer pre, std::span<const char32_t> cps)
      : cps_(cps),
        gpt4o_(pre == PreTokenizer::kGpt4o),
        word_(pre == PreTokenizer::kQwen35 ? uint8_t(kLetter | kMark) : uint8_t(kLetter)),
        not_punct_(pre == PreTokenizer::kQwen35 ? uint8_t(kSpace | kLetter | kNumber | kMark)
                                                : uint8_t(kSpace | kLetter | kNumber)) {
    cls_.reserve(cps.size());
    for (char32_t c : cps) cls_.push_back(char_class(c));
  }

  // End of the piece starting at i (> i).
  size_t match(size_t i) const {
    if (gpt4o_) return match_gpt4o(i);
    if (size_t e = contraction(i)) return e;
    if (size_t e = word(i)) return e;
    if (has(i, kNumber)) return i + 1;  // \p{N}: one digit per piece
    if (size_t e = punct(i)) return e;
    if (size_t e = spaces(i)) return e;
    return i + 1;  // unreachable: every code point is space, word, number or punctuation
  }

 private:
  bool has(size_t k, uint8_t mask) const { return k < cls_.size() && (cls_[k] & mask); }
  bool is_punct(size_t k) const { return k < cls_.size() && !(cls_[k] & not_punct_); }
  char32_t lower_at(size_t k) const {
    if (k >= cps_.size()) return 0;
    const char32_t c = cps_[k];
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  }

  // '(s|t|re|ve|m|ll|d), ASCII case-insensitive.
  size_t contraction(size_t i) const {
    if (i >= cps_.size() || cps_[i] != '\'') return 0;
    const char32_t a = lower_at(i + 1), b = lower_at(i + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
  }

  // [^\r\n\p{L}\p{N}]?WORD+ (the optional prefix is taken when a word follows it).
  size_t word(size_t i) const {
    size_t k = i;
    if (!has(i, kCrLf | kLetter | kNumber) && has(i + 1, word_)) {
      k = i + 1;
    } else if (!has(i, word_)) {
      return 0;
    }
    while (has(k, word_)) ++k;
    return k;
  }

  // ` ?PUNCT+[\r\n]*`; gpt-4o's also takes slashes after the punctuation (`[\r\n/]*`).
  size_t punct(size_t i) const {
    size_t k = i;
    if (cps_[i] == ' ' && is_punct(i + 1)) {
      k = i + 1;
    } else if (!is_punct(i)) {
      return 0;
    }
    while (is_punct(k)) ++k;
    while (has(k, kCrLf) || (gpt4o_ && k < cps_.size() && cps_[k] == '/')) ++k;
    return k;
  }

  // \s*[\r\n]+ | \s+(?!\S) | \s+
  size_t spaces(size_t i) const {
    size_t j = i;
    size_t last_crlf = SIZE_MAX;
    while (has(j, kSpace)) {
      if (cls_[j] & kCrLf) last_crlf = j;
      ++j;
    }
    if (j == i) return 0;
    // Greedy \s* backs off to the last newline of the run; [\r\n]+ then takes just it.
    if (last_crlf != SIZE_MAX) return last_crlf + 1;
    // Leave the last space to prefix the following non-space (e.g. " word").
    if (j < cls_.size() && j - i >= 2) return j - 1;
    return j;
  }

  // gpt-4o's alternatives, in order.
  size_t match_gpt4o(size_t i) const {
    if (size_t e = cased_word(i, /*lower_required=*/true)) return e;
    if (size_t e = cased_word(i, /*lower_required=*/false)) return e;
    if (has(i, kNumber)) {  // \p{N}{1,3}
      size_t k = i + 1;
      while (k < i + 3 && has(k, kNumber)) ++k;
      return k;
    }
    if (size_t e = punct(i)) return e;  // [^\s\p{L}\p{N}]: not_punct_ as qwen2's
    if (size_t e = spaces(i)) return e;
    return i + 1;  // unreachable, as in match()
  }

  // [^\r\n\p{L}\p{N}]? then UPPER*LOWER+ (lower_required) or UPPER+LOWER*, then an optional
  // contraction; 0 when neither with nor without the prefix matches. The prefix is tried first.
  size_t cased_word(size_t i, bool lower_required) const {
    if (!has(i, kCrLf | kLetter | kNumber)) {
      if (size_t e = cased_run(i + 1, lower_required)) return e;
    }
    return cased_run(i, lower_required);
  }

  size_t cased_run(size_t k, bool lower_required) const {
    const uint8_t upper = kUpperOrCaseless | kMark, lower = kLowerOrCaseless | kMark;
    size_t u = k;
    while (has(u, upper)) ++u;  // UPPER*, greedy
    size_t end = 0;
    if (lower_required) {
      // LOWER+ after UPPER*: at u if it can start there, else UPPER* gives back characters
      // until one that LOWER matches (a caseless letter or mark) starts the run.
      size_t start = u;
      if (!has(u, lower)) {
        start = SIZE_MAX;
        for (size_t j = u; j > k; --j) {
          if (has(j - 1, lower)) {
            start = j - 1;
            break;
          }
        }
        if (start == SIZE_MAX) return 0;
      }
      end = start;
      while (has(end, lower)) ++end;
    } else {
      if (u == k) return 0;  // UPPER+
      end = u;
      while (has(end, lower)) ++end;  // LOWER*
    }
    if (size_t c = contraction(end)) return c;
    return end;
  }

  std::span<const char32_t> cps_;
  bool gpt4o_;
  std::vector<uint8_t> cls_;
  uint8_t word_;
  uint8_t not_punct_;
};

}  // namespace

void split_pieces(PreTokenizer pre, std::span<const char32_t> cps, std::vector<size_t>& ends) {
  const Matcher m(pre, cps);
  for (size_t i = 0; i < cps.size();) {
    i = m.match(i);
    ends.push_back(i);
  }
}

std::vector<std::string> pretokenize(PreTokenizer pre, std::string_view text) {
  std::vector<char32_t> cps;
  decode_utf8_lenient(text, cps);
  std::vector<size_t> ends;
  split_pieces(pre, cps, ends);
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t end : ends) {
    std::string& piece = out.emplace_back();
    for (size_t k = begin; k < end; ++k) append_utf8(piece, cps[k]);
    begin = end;
  }
  return out;
}

}  // namespace moe::tokenizer
