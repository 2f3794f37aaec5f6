// History of accepted tokens: a fixed-capacity ring (llama.cpp's last-n windows) or, for a window
// of -1, every token since the last clear().
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moe::sampling {

class TokenRing {
 public:
  static constexpr int32_t kNone = -1;

  // capacity > 0: keep the last `capacity` tokens; 0: keep none; -1: keep all (amortised growth).
  explicit TokenRing(int32_t capacity) : capacity_(capacity) {
    buf_.reserve(capacity > 0 ? static_cast<size_t>(capacity) : capacity < 0 ? 4096 : 0);
  }

  // Appends a token; returns the token that fell out of the window, or kNone.
  int32_t push(int32_t token) {
    if (capacity_ == 0) return kNone;
    if (capacity_ < 0 || buf_.size() < static_cast<size_t>(capacity_)) {
      buf_.push_back(token);
      return kNone;
    }
    const int32_t evicted = buf_[head_];
    buf_[head_] = token;
    head_ = (head_ + 1) % buf_.size();
    return evicted;
  }

  size_t size() const { return buf_.size(); }

  // i = 0 is the most recent token.
  int32_t from_end(size_t i) const {
    const size_t n = buf_.size();
    return buf_[(head_ + n - 1 - i) % n];
  }

  void clear() {
    buf_.clear();
    head_ = 0;
  }

 private:
  int32_t capacity_;
  std::vector<int32_t> buf_;
  size_t head_ = 0;  // oldest element once the ring is full; 0 while filling
};

}  // namespace moe::sampling
