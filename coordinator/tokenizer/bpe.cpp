#include "coordinator/tokenizer/bpe.h"

#include <algorithm>
#include <functional>

#include "common/error.h"

namespace moe::tokenizer {

void BpeEncoder::push_candidate(uint32_t left) {
  const uint32_t right = next_[left];
  if (right >= id_.size()) return;
  const Vocab::Merge m = vocab_.find_merge(id_[left], id_[right]);
  if (m.rank < 0) return;
  heap_.push_back({m.rank, left, id_[left], id_[right], m.result});
  std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
}

void BpeEncoder::encode(std::string_view piece, std::vector<int32_t>& out) {
  if (piece.size() >= UINT32_MAX) throw moe::Error("tokenizer: text piece too long");
  const auto n = static_cast<uint32_t>(piece.size());
  if (n == 0) return;
  if (n == 1) {
    out.push_back(vocab_.byte_token(static_cast<uint8_t>(piece[0])));
    return;
  }
  id_.resize(n);
  next_.resize(n);
  prev_.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    id_[i] = vocab_.byte_token(static_cast<uint8_t>(piece[i]));
    next_[i] = i + 1;
    prev_[i] = i - 1;  // wraps to UINT32_MAX for the first symbol
  }
  heap_.clear();
  for (uint32_t i = 0; i + 1 < n; ++i) push_candidate(i);

  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
    const Candidate c = heap_.back();
    heap_.pop_back();
    // Stale if either side changed since the pair was queued (merged away or merged further).
    const uint32_t right = next_[c.left];
    if (id_[c.left] != c.left_id || right >= n || id_[right] != c.right_id) continue;

    id_[c.left] = c.result;
    id_[right] = -1;
    next_[c.left] = next_[right];
    if (next_[right] < n) prev_[next_[right]] = c.left;
    if (prev_[c.left] < n) push_candidate(prev_[c.left]);
    push_candidate(c.left);
  }
  for (uint32_t i = 0; i < n; i = next_[i]) out.push_back(id_[i]);
}

}  // namespace moe::tokenizer
