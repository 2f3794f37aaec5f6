#include "coordinator/tokenizer/tokenizer.h"

#include "common/error.h"
#include "coordinator/tokenizer/bpe.h"
#include "coordinator/tokenizer/byte_level.h"
#include "coordinator/tokenizer/pretokenize.h"
#include "coordinator/tokenizer/utf8.h"

namespace moe::tokenizer {

Tokenizer Tokenizer::from_gguf(const moe::gguf::GgufFile& f) {
  return Tokenizer(Vocab::from_gguf(f));
}

// Splits out special tokens one token at a time, longest first, over the remaining raw text (as
// llama.cpp does: a longer token wins over a shorter one that overlaps it, wherever it starts).
std::vector<Tokenizer::Fragment> Tokenizer::partition(std::string_view text,
                                                      bool parse_special) const {
  std::vector<Fragment> frags{{-1, 0, text.size()}};
  std::vector<Fragment> next;
  for (int32_t id : vocab_.special_candidates()) {
    const TokenType type = vocab_.type(id);
    if (!parse_special && type != TokenType::kUserDefined) continue;
    const std::string_view tok = vocab_.text(id);
    bool found = false;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.id >= 0 || f.end - f.begin < tok.size()) {
        next.push_back(f);
        continue;
      }
      const std::string_view region = text.substr(0, f.end);
      size_t pos = f.begin;
      for (size_t hit; (hit = region.find(tok, pos)) != std::string_view::npos;) {
        if (hit > pos) next.push_back({-1, pos, hit});
        next.push_back({id, hit, hit + tok.size()});
        pos = hit + tok.size();
        found = true;
      }
      if (pos < f.end) next.push_back({-1, pos, f.end});
    }
    if (found) frags.swap(next);
  }
  return frags;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  BpeEncoder bpe(vocab_);
  std::vector<char32_t> cps;
  std::vector<size_t> ends;
  std::string bytes;
  for (const Fragment& f : partition(text, parse_special)) {
    if (f.id >= 0) {
      out.push_back(f.id);
      continue;
    }
    cps.clear();
    ends.clear();
    decode_utf8_lenient(text.substr(f.begin, f.end - f.begin), cps);
    split_pieces(vocab_.pre(), cps, ends);
    size_t begin = 0;
    for (size_t end : ends) {
      bytes.clear();
      for (size_t k = begin; k < end; ++k) append_utf8(bytes, cps[k]);
      bpe.encode(bytes, out);
      begin = end;
    }
  }
  return out;
}

std::string Tokenizer::token_piece(int32_t id, bool special) const {
  if (!vocab_.valid_id(id)) {
    throw moe::Error("tokenizer: token id " + std::to_string(id) +
                     " is out of range (vocabulary has " + std::to_string(vocab_.n_tokens()) +
                     " tokens)");
  }
  switch (vocab_.type(id)) {
    case TokenType::kNormal:
      return byte_level_decode(vocab_.text(id));
    case TokenType::kUserDefined:
      return std::string(vocab_.text(id));
    case TokenType::kControl:
    case TokenType::kUnknown:
      return special ? std::string(vocab_.text(id)) : std::string();
    case TokenType::kUnused:
    case TokenType::kByte:
      break;
  }
  return {};
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool remove_special,
                              bool unparse_special) const {
  if (remove_special && vocab_.add_bos() && !ids.empty() && ids.front() == bos_id()) {
    ids = ids.subspan(1);
  }
  if (remove_special && vocab_.add_eos() && !ids.empty() && ids.back() == eos_id()) {
    ids = ids.first(ids.size() - 1);
  }
  std::string out;
  for (int32_t id : ids) out += token_piece(id, unparse_special);
  return out;
}

}  // namespace moe::tokenizer
