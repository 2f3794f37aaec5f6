#include "coordinator/tokenizer/stream_detokenizer.h"

#include "coordinator/tokenizer/utf8.h"

namespace moe::tokenizer {

std::string StreamDetokenizer::push(int32_t id) {
  pending_ += tok_->token_piece(id, special_);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const Utf8Step st = scan_utf8(pending_, i);
    if (st.kind == Utf8Step::kTruncated) break;  // may still complete with the next token
    if (st.kind == Utf8Step::kComplete) {
      out.append(pending_, i, st.len);
    } else {
      append_utf8(out, kReplacementChar);
    }
    i += st.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDetokenizer::finish() {
  std::string out;
  if (!pending_.empty()) append_utf8(out, kReplacementChar);  // one unfinished character
  pending_.clear();
  return out;
}

}  // namespace moe::tokenizer
