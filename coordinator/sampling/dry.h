// DRY ("don't repeat yourself", p-e-w's n-gram repetition penalty as in llama.cpp/koboldcpp):
// a token that would extend a sequence already seen earlier in the context is penalised by
// multiplier * base^(length - allowed_length), where length is the longest such repeated suffix;
// sequence breakers cut the suffix so repetition never spans across them.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/sampling/candidates.h"
#include "coordinator/sampling/token_ring.h"

namespace moe::sampling {

struct SamplingParams;

// What DRY needs from the tokenizer to turn breaker strings into token sequences.
struct DryVocab {
  std::function<std::string(int32_t)> piece;                       // decoded text of one token
  std::function<std::vector<int32_t>(std::string_view)> tokenize;  // text -> tokens, no BOS
};

// Breakers as token sequences: a head token followed by a tail. An empty tail means the head
// alone breaks (its text contains a breaker string).
class DryBreakers {
 public:
  struct Entry {
    int32_t head;
    std::vector<int32_t> tail;
  };

  // llama.cpp's mapping: every token whose text contains a breaker is a single-token breaker; every
  // token whose text ends with a proper prefix of a breaker starts a sequence whose tail is the
  // tokenized rest of that breaker. Breakers are capped at 40 bytes and tails at 20 tokens.
  static DryBreakers build(const std::vector<std::string>& breakers, int32_t n_vocab,
                           const DryVocab& vocab);

  void add(int32_t head, std::vector<int32_t> tail);
  bool empty() const { return entries_.empty(); }
  bool is_single_token(int32_t token) const;
  std::span<const Entry> starting_with(int32_t head) const;

 private:
  std::vector<Entry> entries_;  // sorted by head, then tail; no duplicates
};

class DryPenalty {
 public:
  DryPenalty(const SamplingParams& params, int32_t n_vocab, DryBreakers breakers);

  bool enabled() const;
  void accept(int32_t token);
  void reset();
  void apply(Candidates& c);

 private:
  // How many of the most recent tokens a repeat may span before it would include a breaker.
  size_t repeat_limit(size_t n) const;

  float multiplier_, base_;
  int32_t allowed_length_, last_n_;
  DryBreakers breakers_;
  TokenRing history_;
  // Scratch reused across tokens.
  std::vector<int32_t> reversed_;    // window, most recent first
  std::vector<int32_t> z_;           // z-function of reversed_
  std::vector<int32_t> max_repeat_;  // by token id; -1 = no repeat ends before it
  std::vector<int32_t> touched_;     // ids set in max_repeat_, to clear them cheaply
};

}  // namespace moe::sampling
