#include "coordinator/sampling/sampler_steps.h"

#include <gtest/gtest.h>

#include "tests/sampling/test_util.h"

namespace moe::sampling {
namespace {

using test::ids;
using test::log_probs;
using test::make;
using V = std::vector<int32_t>;

// p = {0.5, 0.2, 0.2, 0.1}: ids 1 and 2 tie, so tie-breaking is exercised too.
const std::vector<double> kProbs = {0.5, 0.2, 0.2, 0.1};

TEST(Softmax, MatchesHandComputedValues) {
  Candidates c = make({0.0f, std::log(3.0f)});
  softmax(c);
  EXPECT_NEAR(c.items[0].p, 0.25, 1e-6);
  EXPECT_NEAR(c.items[1].p, 0.75, 1e-6);
  Candidates big = make({1000.0f, 1000.0f});  // no overflow
  softmax(big);
  EXPECT_NEAR(big.items[0].p, 0.5, 1e-6);
}

TEST(TopK, KeepsHighestWithTiesToLowerIds) {
  Candidates c = make({1, 3, 2, 3, 0});
  apply_top_k(c, 2);
  EXPECT_EQ(ids(c), (V{1, 3}));
  EXPECT_TRUE(c.sorted);
  c = make({1, 3, 2, 3, 0});
  apply_top_k(c, 3);
  EXPECT_EQ(ids(c), (V{1, 3, 2}));
  c = make({5, 5, 5});
  apply_top_k(c, 1);
  EXPECT_EQ(ids(c), (V{0}));
}

TEST(TopK, NonPositiveOrLargeKIsOff) {
  for (int32_t k : {0, -1, 5, 100}) {
    Candidates c = make({1, 3, 2, 3, 0});
    apply_top_k(c, k);
    EXPECT_EQ(ids(c), (V{0, 1, 2, 3, 4})) << k;
  }
}

TEST(TopP, KeepsSmallestPrefixReachingP) {
  Candidates c = make(log_probs(kProbs));
  apply_top_p(c, 0.6f, 0);  // 0.5 < 0.6 <= 0.7
  EXPECT_EQ(ids(c), (V{0, 1}));
  c = make(log_probs(kProbs));
  apply_top_p(c, 0.75f, 0);  // 0.7 < 0.75 <= 0.9
  EXPECT_EQ(ids(c), (V{0, 1, 2}));
  c = make(log_probs(kProbs));
  apply_top_p(c, 0.3f, 0);
  EXPECT_EQ(ids(c), (V{0}));
  c = make(log_probs(kProbs));
  apply_top_p(c, 1.0f, 0);  // off
  EXPECT_EQ(c.size(), 4u);
}

TEST(TopP, HonoursMinKeep) {
  Candidates c = make(log_probs(kProbs));
  apply_top_p(c, 0.3f, 3);
  EXPECT_EQ(ids(c), (V{0, 1, 2}));
}

TEST(TopP, WorksBeyondTheFirstSortedChunk) {
  // 1000 equal tokens: the nucleus for p = 0.5 is 500 tokens, past the first partial sort.
  Candidates c = make(std::vector<float>(1000, 0.0f));
  apply_top_p(c, 0.5f - 1e-4f, 0);
  ASSERT_EQ(c.size(), 500u);
  for (int32_t i = 0; i < 500; ++i) ASSERT_EQ(c.items[static_cast<size_t>(i)].id, i);
}

TEST(MinP, KeepsTokensAboveFractionOfMax) {
  Candidates c = make(log_probs(kProbs));
  apply_min_p(c, 0.3f, 0);  // threshold 0.15
  EXPECT_EQ(ids(c), (V{0, 1, 2}));
  c = make(log_probs(kProbs));
  apply_min_p(c, 0.5f, 0);  // threshold 0.25
  EXPECT_EQ(ids(c), (V{0}));
  c = make(log_probs(kProbs));
  apply_min_p(c, 0.0f, 0);  // off
  EXPECT_EQ(c.size(), 4u);
}

TEST(MinP, HonoursMinKeep) {
  Candidates c = make(log_probs(kProbs));
  apply_min_p(c, 0.5f, 2);
  EXPECT_EQ(ids(c), (V{0, 1}));
}

TEST(Typical, KeepsMostTypicalTokens) {
  // Entropy H = 1.2206; |-ln p - H| = 0.527 (p .5), 0.389 (p .2, twice), 1.082 (p .1).
  StepScratch s;
  Candidates c = make(log_probs(kProbs));
  apply_typical(c, 0.3f, 0, s);  // 0.2 <= 0.3 < 0.4: the most likely token is dropped
  EXPECT_EQ(ids(c), (V{1, 2}));
  EXPECT_FALSE(c.sorted);
  c = make(log_probs(kProbs));
  apply_typical(c, 0.5f, 0, s);  // 0.4 <= 0.5 < 0.9
  EXPECT_EQ(ids(c), (V{1, 2, 0}));
  c = make(log_probs(kProbs));
  apply_typical(c, 0.3f, 3, s);
  EXPECT_EQ(ids(c), (V{1, 2, 0}));
  c = make(log_probs(kProbs));
  apply_typical(c, 1.0f, 0, s);  // off
  EXPECT_EQ(ids(c), (V{0, 1, 2, 3}));
}

TEST(TopNSigma, KeepsLogitsWithinNSigmaOfMax) {
  // mean 4.4, population sigma sqrt(34.64) = 5.8856.
  const std::vector<float> logits = {10, 9, 8, 0, -5};
  Candidates c = make(logits);
  apply_top_n_sigma(c, 1.0f);  // cut 4.11
  EXPECT_EQ(ids(c), (V{0, 1, 2}));
  c = make(logits);
  apply_top_n_sigma(c, 0.3f);  // cut 8.23
  EXPECT_EQ(ids(c), (V{0, 1}));
  c = make(logits);
  apply_top_n_sigma(c, 2.0f);  // cut -1.77
  EXPECT_EQ(ids(c), (V{0, 1, 2, 3}));
  c = make(logits);
  apply_top_n_sigma(c, -1.0f);  // off
  EXPECT_EQ(c.size(), 5u);
}

TEST(Xtc, RemovesAllTopChoicesButTheLeastLikely) {
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  Candidates c = make(log_probs(probs));
  apply_xtc(c, 0.1f, 0);  // 3 above: remove ids 0 and 1
  EXPECT_EQ(ids(c), (V{2, 3}));
  c = make(log_probs(probs));
  apply_xtc(c, 0.2f, 0);  // 2 above: remove id 0
  EXPECT_EQ(ids(c), (V{1, 2, 3}));
  c = make(log_probs(probs));
  apply_xtc(c, 0.4f, 0);  // only 1 above: nothing
  EXPECT_EQ(ids(c), (V{0, 1, 2, 3}));
  c = make(log_probs(probs));
  apply_xtc(c, 0.1f, 3);  // would leave 2 < min_keep
  EXPECT_EQ(ids(c), (V{0, 1, 2, 3}));
}

TEST(Temperature, ScalesLogits) {
  Candidates c = make({1.0f, -2.0f});
  apply_temperature(c, 0.5f);
  EXPECT_FLOAT_EQ(c.items[0].logit, 2.0f);
  EXPECT_FLOAT_EQ(c.items[1].logit, -4.0f);
}

TEST(Temperature, NonPositiveKeepsArgmaxLowestId) {
  for (float t : {0.0f, -1.0f}) {
    Candidates c = make({3, 5, 1, 5});
    apply_temperature(c, t);
    EXPECT_EQ(ids(c), (V{1})) << t;
  }
}

}  // namespace
}  // namespace moe::sampling

namespace moe::sampling {
namespace {

TEST(TopP, LargeVocabularyMatchesFullSortReference) {
  // Above 1024 tokens top_p bounds the nucleus with logit buckets before sorting; the result must
  // equal the plain definition (full sort, then the shortest prefix with mass >= p).
  std::vector<float> logits(5000);
  uint32_t x = 12345;
  for (float& v : logits) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(x >> 8) / static_cast<float>(1 << 24) * 12.0f;
  }
  for (float p : {0.1f, 0.5f, 0.9f, 0.99f}) {
    Candidates ref = test::make(logits);
    softmax(ref);
    sort_desc(ref);
    double mass = 0.0;
    size_t n = 0;
    while (mass < p) mass += ref.items[n++].p;
    truncate(ref, n);
    Candidates c = test::make(logits);
    apply_top_p(c, p, 0);
    EXPECT_EQ(test::ids(c), test::ids(ref)) << p;
    EXPECT_GT(c.size(), 1u);
  }
}

}  // namespace
}  // namespace moe::sampling
