#include "coordinator/sampling/dry.h"

#include <gtest/gtest.h>

#include <cmath>

#include "coordinator/sampling/sampler_params.h"
#include "tests/sampling/test_util.h"

namespace moe::sampling {
namespace {

using test::make;

constexpr int32_t kVocab = 12;

SamplingParams dry_params() {
  SamplingParams p;
  p.dry_multiplier = 1.0f;
  p.dry_base = 2.0f;
  p.dry_allowed_length = 2;
  p.dry_penalty_last_n = -1;
  return p;
}

// Penalty DRY subtracts from each token (logits all 0 before) after the given history.
std::vector<float> penalties(const std::vector<int32_t>& history, DryBreakers breakers = {},
                             SamplingParams params = dry_params()) {
  DryPenalty dry(params, kVocab, std::move(breakers));
  for (int32_t t : history) dry.accept(t);
  Candidates c = make(std::vector<float>(kVocab, 0.0f));
  dry.apply(c);
  std::vector<float> out;
  for (const Candidate& x : c.items) out.push_back(-x.logit);
  return out;
}

std::vector<float> only(int32_t token, float value) {
  std::vector<float> v(kVocab, 0.0f);
  v[static_cast<size_t>(token)] = value;
  return v;
}

DryBreakers single(int32_t token) {
  DryBreakers b;
  b.add(token, {});
  return b;
}

TEST(Dry, PenalisesTokenThatContinuesRepeat) {
  // a b c d a b: "a b" (length 2 = allowed) was followed by c -> 1 * 2^0.
  EXPECT_EQ(penalties({0, 1, 2, 3, 0, 1}), only(2, 1.0f));
  // a b c d e a b c d: length 4 -> 2^(4-2) on e.
  EXPECT_EQ(penalties({0, 1, 2, 3, 4, 0, 1, 2, 3}), only(4, 4.0f));
}

TEST(Dry, ShortRepeatsAreAllowed) {
  EXPECT_EQ(penalties({0, 1, 2, 3, 1}), only(0, 0.0f));  // repeat of length 1 < allowed 2
  SamplingParams p = dry_params();
  p.dry_allowed_length = 1;  // now length 1 counts: token 2 followed the earlier "1"
  EXPECT_EQ(penalties({0, 1, 2, 3, 1}, {}, p), only(2, 1.0f));
}

TEST(Dry, TakesLongestRepeatPerToken) {
  // 5 6 7 9 6 7 8 5 6 7: the suffix "5 6 7" occurred before 9 (length 3 -> 2^1) and its
  // shorter suffix "6 7" before 8 (length 2 -> 2^0).
  std::vector<float> expected(kVocab, 0.0f);
  expected[9] = 2.0f;
  expected[8] = 1.0f;
  EXPECT_EQ(penalties({5, 6, 7, 9, 6, 7, 8, 5, 6, 7}), expected);
}

TEST(Dry, BreakerInsideRepeatStopsIt) {
  // a BRK c X a BRK c: without breakers, "a BRK c" (3) was followed by X (3) -> 2^1.
  const std::vector<int32_t> history = {0, 5, 2, 3, 0, 5, 2};
  EXPECT_EQ(penalties(history), only(3, 2.0f));
  // With 5 a breaker the repeat can only span the 1 token after it: below allowed length.
  EXPECT_EQ(penalties(history, single(5)), only(3, 0.0f));
}

TEST(Dry, BreakerTokenItselfIsNotPenalised) {
  const std::vector<int32_t> history = {0, 1, 5, 3, 0, 1};  // "a b" was followed by 5
  EXPECT_EQ(penalties(history), only(5, 1.0f));
  EXPECT_EQ(penalties(history, single(5)), only(5, 0.0f));
}

TEST(Dry, MultiTokenBreakerNeedsWholeSequence) {
  DryBreakers b;
  b.add(6, {7});  // the breaker is "6 7"
  // 0 6 7 1 9 0 6 7 1: "0 6 7 1" (4) was followed by 9 -> 2^2, unless "6 7" breaks it.
  const std::vector<int32_t> h = {0, 6, 7, 1, 9, 0, 6, 7, 1};
  EXPECT_EQ(penalties(h), only(9, 4.0f));
  EXPECT_EQ(penalties(h, b), only(9, 0.0f));
  // 6 followed by 8 is not the breaker: the repeat stands.
  DryBreakers b2;
  b2.add(6, {7});
  EXPECT_EQ(penalties({0, 6, 8, 1, 9, 0, 6, 8, 1}, std::move(b2)), only(9, 4.0f));
}

TEST(Dry, WindowLimitsHistory) {
  SamplingParams p = dry_params();
  p.dry_penalty_last_n = 4;  // of a b c d a b only c d a b is seen: no repeat
  EXPECT_EQ(penalties({0, 1, 2, 3, 0, 1}, {}, p), only(2, 0.0f));
  p.dry_penalty_last_n = 6;
  EXPECT_EQ(penalties({0, 1, 2, 3, 0, 1}, {}, p), only(2, 1.0f));
}

TEST(Dry, OffWhenMultiplierZero) {
  SamplingParams p = dry_params();
  p.dry_multiplier = 0.0f;
  EXPECT_EQ(penalties({0, 1, 2, 3, 0, 1}, {}, p), only(2, 0.0f));
}

TEST(Dry, ExponentIsCappedAndPenaltyFinite) {
  SamplingParams p = dry_params();
  p.dry_base = 3.0f;                           // cap = floor(88.72 / ln 3) = 80
  const std::vector<int32_t> history(200, 7);  // repeat length 199 before 7
  const std::vector<float> got = penalties(history, {}, p);
  EXPECT_TRUE(std::isfinite(got[7]));
  EXPECT_FLOAT_EQ(got[7], static_cast<float>(std::pow(3.0, 80)));
}

TEST(Dry, ResetForgetsHistory) {
  DryPenalty dry(dry_params(), kVocab, {});
  for (int32_t t : {0, 1, 2, 3, 0, 1}) dry.accept(t);
  dry.reset();
  for (int32_t t : {0, 1}) dry.accept(t);
  Candidates c = make(std::vector<float>(kVocab, 0.0f));
  dry.apply(c);
  for (const Candidate& x : c.items) EXPECT_EQ(x.logit, 0.0f);
}

// Toy vocabulary: greedy longest-match tokenizer over these pieces.
const std::vector<std::string> kPieces = {"a", "b", ":", "x:y", "\n", "ab", "c", "z"};

DryVocab toy_vocab() {
  DryVocab v;
  v.piece = [](int32_t t) { return kPieces[static_cast<size_t>(t)]; };
  v.tokenize = [](std::string_view text) {
    std::vector<int32_t> out;
    while (!text.empty()) {
      size_t best_len = 0;
      int32_t best = -1;
      for (size_t i = 0; i < kPieces.size(); ++i) {
        if (kPieces[i].size() > best_len && text.substr(0, kPieces[i].size()) == kPieces[i]) {
          best_len = kPieces[i].size();
          best = static_cast<int32_t>(i);
        }
      }
      if (best < 0) break;
      out.push_back(best);
      text.remove_prefix(best_len);
    }
    return out;
  };
  return v;
}

TEST(DryBreakers, BuildsFromStringsLikeLlamaCpp) {
  const DryBreakers b = DryBreakers::build({":", "bc", ""}, 8, toy_vocab());
  // ":" is inside pieces ":" and "x:y": single-token breakers.
  EXPECT_TRUE(b.is_single_token(2));
  EXPECT_TRUE(b.is_single_token(3));
  EXPECT_FALSE(b.is_single_token(0));
  // "bc": pieces ending in "b" ("b", "ab") start it; the tail is tokenize("c") = {6}.
  for (int32_t head : {1, 5}) {
    const auto range = b.starting_with(head);
    ASSERT_EQ(range.size(), 1u) << head;
    EXPECT_EQ(range[0].tail, std::vector<int32_t>{6});
    EXPECT_FALSE(b.is_single_token(head));
  }
  EXPECT_TRUE(b.starting_with(6).empty());
  EXPECT_TRUE(b.starting_with(7).empty());
}

}  // namespace
}  // namespace moe::sampling
