// How many drafted tokens to verify (issue 33's cost model): verifying k drafts costs a forward of
// k + 1 tokens, which with offloaded experts can route up to k + 1 times the experts of one
// token, and yields the accepted drafts plus the token chosen after them. The policy measures
// both sides as it goes (the acceptance per drafted token, the time of a forward of n tokens)
// and picks the length with the most expected tokens per second, 0 when drafting does not pay.
// While drafting is off the drafter's first token is still compared with the chosen one, so the
// acceptance estimate stays current at no cost.
#pragma once

#include <array>
#include <cstdint>

namespace moe::model {

class DraftPolicy {
 public:
  static constexpr int kMaxDraft = 64;

  explicit DraftPolicy(int draft_max = 8);

  // How many of `available` drafted tokens to verify now (0: decode one token alone).
  int length(int available) const;

  // A decode step of n tokens (the token just chosen and n - 1 drafts) took `seconds`, replay of
  // a recurrent state included.
  void observe_step(int n, double seconds);
  // Of `drafted` tokens checked against the chosen ones, the first `accepted` agreed (the rest
  // after the first disagreement are not evidence either way).
  void observe_drafts(int drafted, int accepted);

  // Probability that a drafted token stands given that those before it did.
  double acceptance() const;
  // Expected seconds of a step of n tokens: measured, else on the line through the measured
  // sizes; with only single tokens measured, a 2-token step is assumed as cheap as one (so a
  // draft gets tried once and measured).
  double step_seconds(int n) const;
  // Expected tokens per step when verifying k drafts: 1 + p + ... + p^k.
  double expected_tokens(int k) const;

 private:
  int draft_max_;
  // Acceptance: decayed counts of drafted tokens that stood and of those checked.
  double stood_ = 0.0, checked_ = 0.0;
  // Step times: decayed mean seconds and weight per size n (index n, 1..kMaxDraft + 1).
  std::array<double, kMaxDraft + 2> mean_{}, weight_{};
};

}  // namespace moe::model
