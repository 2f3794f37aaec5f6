#include "coordinator/tokenizer/vocab.h"

#include <algorithm>
#include <array>
#include <limits>

#include "common/error.h"
#include "coordinator/tokenizer/byte_level.h"
#include "coordinator/tokenizer/utf8.h"

namespace moe::tokenizer {
namespace {

using moe::gguf::ArrayValue;
using moe::gguf::GgufFile;
using moe::gguf::ValueType;

constexpr std::string_view kPrefix = "tokenizer: ";

[[noreturn]] void fail(const std::string& msg) { throw moe::Error(std::string(kPrefix) + msg); }

std::string quoted(std::string_view s) {
  std::string q;  // appended piecewise: GCC 12 warns (-Wrestrict) on "'" + str + "'" chains
  q.reserve(s.size() + 2);
  q.push_back('\'');
  q.append(s);
  q.push_back('\'');
  return q;
}

PreTokenizer parse_pre(std::string_view name) {
  // Aliases llama.cpp maps to its qwen2 splitter (same regex).
  static constexpr std::array<std::string_view, 3> kQwen2 = {"qwen2", "deepseek-r1-qwen", "megrez"};
  if (std::find(kQwen2.begin(), kQwen2.end(), name) != kQwen2.end()) return PreTokenizer::kQwen2;
  if (name == "qwen35") return PreTokenizer::kQwen35;
  if (name == "gpt-4o") return PreTokenizer::kGpt4o;
  fail("unsupported pre-tokenizer tokenizer.ggml.pre = " + quoted(name) +
       " (supported: qwen2, deepseek-r1-qwen, megrez, qwen35, gpt-4o)");
}

uint64_t mix(uint64_t k) {  // splitmix64 finalizer: spreads (left, right) pairs over the table
  k ^= k >> 30;
  k *= 0xbf58476d1ce4e5b9ull;
  k ^= k >> 27;
  k *= 0x94d049bb133111ebull;
  return k ^ (k >> 31);
}

uint64_t text_hash(std::string_view s) {  // FNV-1a, then mixed: token texts are short
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return mix(h);
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

}  // namespace

Vocab Vocab::from_gguf(const GgufFile& f) {
  const std::string_view model = f.require_string("tokenizer.ggml.model");
  if (model != "gpt2") {
    fail("unsupported tokenizer.ggml.model = " + quoted(model) +
         " (only gpt2 byte-level BPE is supported)");
  }
  Vocab v;
  v.pre_name_ = std::string(f.require_string("tokenizer.ggml.pre"));
  v.pre_ = parse_pre(v.pre_name_);
  v.load_tokens(f);
  v.load_merges(f);
  v.load_special_ids(f);
  v.add_bos_ = f.get_bool("tokenizer.ggml.add_bos_token", false);
  v.add_eos_ = f.get_bool("tokenizer.ggml.add_eos_token", false);
  v.build_eog();

  for (int32_t id = 0; id < v.n_tokens(); ++id) {
    const TokenType t = v.types_[id];
    if ((t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) &&
        !v.text(id).empty()) {
      v.special_candidates_.push_back(id);
    }
  }
  std::stable_sort(v.special_candidates_.begin(), v.special_candidates_.end(),
                   [&](int32_t a, int32_t b) { return v.text(a).size() > v.text(b).size(); });
  return v;
}

void Vocab::load_tokens(const GgufFile& f) {
  const ArrayValue& toks = f.require_array("tokenizer.ggml.tokens");
  if (toks.elem_type != ValueType::STRING) fail("tokenizer.ggml.tokens is not an array of strings");
  if (toks.count == 0) fail("tokenizer.ggml.tokens is empty");
  if (toks.count > uint64_t(std::numeric_limits<int32_t>::max())) {
    fail("tokenizer.ggml.tokens has too many entries");
  }
  const auto n = static_cast<int32_t>(toks.count);

  size_t total = 0;
  for (std::string_view s : toks.strings) total += s.size();
  if (total > std::numeric_limits<uint32_t>::max()) fail("token texts exceed 4 GiB");
  blob_.reserve(total);
  offsets_.reserve(size_t(n) + 1);
  offsets_.push_back(0);
  for (std::string_view s : toks.strings) {
    blob_.insert(blob_.end(), s.begin(), s.end());
    offsets_.push_back(static_cast<uint32_t>(blob_.size()));
  }

  types_.assign(size_t(n), TokenType::kNormal);  // llama.cpp's default when the key is absent
  if (const auto* tv = f.find("tokenizer.ggml.token_type")) {
    const ArrayValue* arr = std::get_if<ArrayValue>(&tv->v);
    if (!arr) fail("tokenizer.ggml.token_type is not an array");
    if (arr->count != toks.count) {
      fail("tokenizer.ggml.token_type has " + std::to_string(arr->count) +
           " entries but there are " + std::to_string(n) + " tokens");
    }
    for (int32_t id = 0; id < n; ++id) {
      const int64_t t = arr->int_at(uint64_t(id));
      if (t < 1 || t > 6) {
        fail("token " + std::to_string(id) + " has invalid type " + std::to_string(t) +
             " in tokenizer.ggml.token_type (expected 1..6)");
      }
      types_[size_t(id)] = static_cast<TokenType>(t);
    }
  }

  size_t cap = 16;
  while (cap < size_t(n) * 2) cap *= 2;
  by_text_.assign(cap, TextSlot{});
  for (int32_t id = 0; id < n; ++id) {
    const std::string_view t = text(id);
    const uint64_t h = text_hash(t);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & (cap - 1);; i = (i + 1) & (cap - 1)) {
      TextSlot& slot = by_text_[i];
      if (slot.id < 0 || (slot.tag == tag && text(slot.id) == t)) {
        slot = {tag, id};  // a later duplicate replaces the earlier one, as in llama.cpp
        break;
      }
    }
  }

  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_codepoint(static_cast<uint8_t>(b)));
    byte_tokens_[b] = find(s);
    if (byte_tokens_[b] < 0) {
      fail("vocabulary lacks the byte-level token " + quoted(s) + " for byte " + std::to_string(b));
    }
  }
}

int32_t Vocab::find(std::string_view s) const {
  const uint64_t h = text_hash(s);
  const auto tag = static_cast<uint32_t>(h >> 32);
  const size_t mask = by_text_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const TextSlot& slot = by_text_[i];
    if (slot.id < 0) return -1;
    if (slot.tag == tag && text(slot.id) == s) return slot.id;
  }
}

void Vocab::load_merges(const GgufFile& f) {
  const ArrayValue& arr = f.require_array("tokenizer.ggml.merges");
  if (arr.elem_type != ValueType::STRING) fail("tokenizer.ggml.merges is not an array of strings");
  if (arr.count > uint64_t(std::numeric_limits<int32_t>::max())) {
    fail("tokenizer.ggml.merges has too many entries");
  }
  size_t cap = 16;
  while (cap < arr.count * 2) cap *= 2;
  merges_.assign(cap, MergeSlot{});

  std::string joined;
  for (size_t rank = 0; rank < arr.strings.size(); ++rank) {
    const std::string_view m = arr.strings[rank];
    const size_t sp = m.find(' ');
    const auto bad = [&](const std::string& why) {
      fail("tokenizer.ggml.merges[" + std::to_string(rank) + "] = " + quoted(m) + ": " + why);
    };
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == m.size() ||
        m.find(' ', sp + 1) != std::string_view::npos) {
      bad("expected two non-empty parts separated by one space");
    }
    const std::string_view a = m.substr(0, sp), b = m.substr(sp + 1);
    joined.assign(a);
    joined.append(b);
    const int32_t ia = find(a), ib = find(b), ir = find(joined);
    // Hugging Face refuses such merges too: BPE could only ever produce non-tokens from them.
    if (ia < 0) bad(quoted(a) + " is not a token");
    if (ib < 0) bad(quoted(b) + " is not a token");
    if (ir < 0) bad("the merged text " + quoted(joined) + " is not a token");

    const uint64_t key = pair_key(ia, ib);
    for (size_t i = mix(key) & (cap - 1);; i = (i + 1) & (cap - 1)) {
      MergeSlot& s = merges_[i];
      if (s.key == key) break;  // duplicate merge: the first (lowest rank) wins
      if (s.key == ~0ull) {
        s.key = key;
        s.merge = {static_cast<int32_t>(rank), ir};
        ++n_merges_;
        break;
      }
    }
  }
}

Vocab::Merge Vocab::find_merge(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  const size_t mask = merges_.size() - 1;
  for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
    const MergeSlot& s = merges_[i];
    if (s.key == key) return s.merge;
    if (s.key == ~0ull) return {};
  }
}

void Vocab::load_special_ids(const GgufFile& f) {
  const auto read = [&](std::string_view name, int32_t& out) {
    const std::string key = "tokenizer.ggml." + std::string(name) + "_token_id";
    const auto* val = f.find(key);
    if (!val) return;
    int64_t id;
    if (const auto* u = std::get_if<uint64_t>(&val->v)) {
      id = *u > uint64_t(std::numeric_limits<int64_t>::max()) ? -1 : int64_t(*u);
    } else if (const auto* i = std::get_if<int64_t>(&val->v)) {
      id = *i;
    } else {
      fail(key + " is not an integer");
    }
    if (id < 0 || id >= n_tokens()) {
      fail(key + " = " + std::to_string(id) + " is out of range (vocabulary has " +
           std::to_string(n_tokens()) + " tokens)");
    }
    out = static_cast<int32_t>(id);
  };
  SpecialIds& s = special_;
  read("bos", s.bos);
  read("eos", s.eos);
  read("eot", s.eot);
  read("eom", s.eom);
  read("unknown", s.unk);
  read("padding", s.pad);
  read("seperator", s.sep);  // sic: the GGUF key is spelled this way
  read("fim_pre", s.fim_pre);
  read("fim_suf", s.fim_suf);
  read("fim_mid", s.fim_mid);
  read("fim_pad", s.fim_pad);
  read("fim_rep", s.fim_rep);
  read("fim_sep", s.fim_sep);

  // Ids older converters did not write are recognised by text, as llama.cpp does.
  const auto detect = [&](int32_t& out, std::initializer_list<std::string_view> texts) {
    if (out >= 0) return;
    for (std::string_view t : texts) {
      if (const int32_t id = find(t); id >= 0) {
        out = id;
        return;
      }
    }
  };
  detect(s.eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
                 "_<EOT>", "<｜end▁of▁sentence｜>"});
  detect(s.eom, {"<|eom_id|>"});
  detect(s.fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>"});
  detect(s.fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>"});
  detect(s.fim_mid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>"});
  detect(s.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>"});
  detect(s.fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  detect(s.fim_sep, {"<|file_sep|>", "<file_sep>", "<fim-sep>", "<fim_sep>"});
}

void Vocab::build_eog() {
  // End-of-generation set as llama.cpp builds it: tokens recognised by text, then eos/eot/eom
  // and the FIM pad/repo/separator tokens.
  static constexpr std::array<std::string_view, 14> kEogTexts = {
      "<|eot_id|>", "<|im_end|>", "<|end|>",         "<|return|>",        "<|call|>",
      "<|flush|>",  "<|calls|>",  "<end_of_turn>",   "<|endoftext|>",     "<|eom_id|>",
      "<EOT>",      "_<EOT>",     "<|end_of_text|>", "<end_of_utterance>"};
  for (std::string_view t : kEogTexts) {
    if (const int32_t id = find(t); id >= 0) {
      eog_.push_back(id);
      // A generation end must never be produced from plain text.
      if (types_[size_t(id)] != TokenType::kControl) types_[size_t(id)] = TokenType::kControl;
    }
  }
  for (int32_t id : {special_.eos, special_.eot, special_.eom, special_.fim_pad, special_.fim_rep,
                     special_.fim_sep}) {
    if (id >= 0) eog_.push_back(id);
  }
  std::sort(eog_.begin(), eog_.end());
  eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());

  // gpt-oss (o200k_harmony) and solar-open: <|end|> only ends a message when <|return|> and
  // <|call|> (<|calls|> and <|flush|>) end the generation, as llama.cpp decides it.
  const int32_t end = find("<|end|>");
  const bool harmony = find("<|return|>") >= 0 && find("<|call|>") >= 0;
  const bool solar = find("<|calls|>") >= 0 && find("<|flush|>") >= 0;
  if (end >= 0 && (harmony || solar)) {
    eog_.erase(std::remove(eog_.begin(), eog_.end(), end), eog_.end());
  }
}

bool Vocab::is_eog(int32_t id) const { return std::binary_search(eog_.begin(), eog_.end(), id); }

}  // namespace moe::tokenizer
