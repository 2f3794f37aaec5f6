// Byte-level BPE merging of one pre-tokenized piece: start from one symbol per byte, repeatedly
// merge the adjacent pair with the lowest merge rank (ties: leftmost). A heap of candidate pairs
// with lazy invalidation keeps this O(n log n), so a 100k-byte word is no slower per byte than a
// short one.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "coordinator/tokenizer/vocab.h"

namespace moe::tokenizer {

class BpeEncoder {
 public:
  explicit BpeEncoder(const Vocab& vocab) : vocab_(vocab) {}

  // Appends the token ids of `piece` (raw bytes) to `out`. Reuses internal buffers, so one
  // encoder per thread.
  void encode(std::string_view piece, std::vector<int32_t>& out);

 private:
  struct Candidate {
    int32_t rank;
    uint32_t left;  // symbol index; symbols keep their index when the right one merges into them
    int32_t left_id, right_id, result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  void push_candidate(uint32_t left);

  const Vocab& vocab_;
  std::vector<int32_t> id_;     // token id per symbol; -1 once merged away
  std::vector<uint32_t> next_;  // next live symbol (n = none)
  std::vector<uint32_t> prev_;  // previous live symbol (UINT32_MAX = none)
  std::vector<Candidate> heap_;
};

}  // namespace moe::tokenizer
