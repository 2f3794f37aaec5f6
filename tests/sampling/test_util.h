// Helpers shared by the sampling tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "coordinator/sampling/candidates.h"

namespace moe::sampling::test {

// Candidates with ids 0..n-1 and the given logits, in id order.
inline Candidates make(const std::vector<float>& logits) {
  Candidates c;
  for (size_t i = 0; i < logits.size(); ++i) {
    c.items.push_back(Candidate{static_cast<int32_t>(i), logits[i], 0.0f});
  }
  return c;
}

// Logits whose softmax is exactly `probs` (up to rounding).
inline std::vector<float> log_probs(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

inline std::vector<int32_t> ids(const Candidates& c) {
  std::vector<int32_t> out;
  for (const Candidate& x : c.items) out.push_back(x.id);
  return out;
}

// Returns the message of the moe::Error thrown by fn, or "" (which fails the test) if none.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected moe::Error";
  return "";
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace moe::sampling::test
