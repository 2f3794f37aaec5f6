#include "coordinator/model/ngram_draft.h"

#include <algorithm>

namespace moe::model {

std::vector<int32_t> ngram_draft(std::span<const int32_t> history, const NgramDraftOptions& opt) {
  const auto len = static_cast<int64_t>(history.size());
  if (opt.draft_max < 1 || opt.n_min < 1 || opt.n_max < opt.n_min) return {};
  for (int64_t n = std::min<int64_t>(opt.n_max, len - 1); n >= opt.n_min; --n) {
    const auto key = history.subspan(static_cast<size_t>(len - n));
    // Latest start first; a match must leave at least one token after it before the key.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(key.begin(), key.end(), history.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min<int64_t>(opt.draft_max, len - from);
      return {history.begin() + from, history.begin() + from + count};
    }
  }
  return {};
}

}  // namespace moe::model
