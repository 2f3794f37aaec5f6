#include "coordinator/sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "tests/sampling/test_util.h"

namespace moe::sampling {
namespace {

using test::contains;
using test::error_of;
using test::log_probs;

// Plain sampling from the softmax: every filter off, temperature 1.
SamplingParams plain(uint32_t seed) {
  SamplingParams p;
  p.seed = seed;
  p.temp = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

// Deterministic pseudo-logits for position `step` (no library distribution involved).
std::vector<float> logits_for(int step, int n_vocab) {
  std::vector<float> out(static_cast<size_t>(n_vocab));
  uint32_t x = 2463534242u + static_cast<uint32_t>(step) * 7919u;
  for (float& v : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = static_cast<float>(x % 1000) / 250.0f;  // [0, 4)
  }
  return out;
}

std::vector<int32_t> generate(Sampler& s, int n, int n_vocab) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = s.sample(logits_for(i, n_vocab));
    s.accept(t);
    out.push_back(t);
  }
  return out;
}

TEST(Sampler, GreedyPicksArgmaxTiesToLowestId) {
  SamplingParams p;
  p.temp = 0.0f;
  Sampler s(p, 4);
  EXPECT_EQ(s.sample(std::vector<float>{1, 5, 5, 2}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{7, 5, 7, 2}), 0);
  EXPECT_EQ(s.sample(std::vector<float>{1, 2, 3, 9}), 3);
}

// logit_bias is added before the chain: a bias moves the argmax, -inf bans a token, ids past the
// vocabulary and NaN or +inf biases are refused.
TEST(Sampler, LogitBiasShiftsAndBans) {
  SamplingParams p;
  p.temp = 0.0f;
  p.logit_bias = {{0, 10.0f}, {3, -INFINITY}};
  Sampler s(p, 4);
  EXPECT_EQ(s.sample(std::vector<float>{1, 5, 5, 2}), 0);    // 11 beats 5
  EXPECT_EQ(s.sample(std::vector<float>{-20, 5, 4, 9}), 1);  // 3 banned, 0 at -10
  EXPECT_THROW(s.sample(std::vector<float>{-INFINITY, -INFINITY, -INFINITY, 1}), moe::Error);
  SamplingParams outside;
  outside.logit_bias = {{4, 1.0f}};
  EXPECT_THROW(Sampler(outside, 4), moe::Error);
  for (float bad : {NAN, INFINITY}) {
    SamplingParams q;
    q.logit_bias = {{1, bad}};
    EXPECT_THROW(q.validate(), moe::Error);
  }
  SamplingParams negative;
  negative.logit_bias = {{-1, 1.0f}};
  EXPECT_THROW(negative.validate(), moe::Error);
}

TEST(Sampler, NegativeTempIsGreedyEvenWithoutTemperatureStep) {
  SamplingParams p = plain(1);
  p.temp = -1.0f;
  p.order = parse_sampler_order("top_k");
  Sampler s(p, 4);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(s.sample(std::vector<float>{1, 2.5f, 2.5f, 2.4f}), 1);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferent) {
  constexpr int kVocab = 1000;
  Sampler a(plain(42), kVocab), b(plain(42), kVocab), c(plain(43), kVocab);
  const std::vector<int32_t> ta = generate(a, 200, kVocab);
  EXPECT_EQ(ta, generate(b, 200, kVocab));
  EXPECT_NE(ta, generate(c, 200, kVocab));
  // reset() restarts the stream: the same 200 tokens again.
  a.reset();
  EXPECT_EQ(ta, generate(a, 200, kVocab));
}

TEST(Sampler, DefaultParamsAreReproducible) {
  constexpr int kVocab = 5000;
  SamplingParams p;
  p.seed = 7;
  p.repeat_penalty = 1.1f;
  p.dry_multiplier = 0.8f;
  p.dry_sequence_breakers.clear();
  p.xtc_probability = 0.5f;
  Sampler a(p, kVocab), b(p, kVocab);
  EXPECT_EQ(generate(a, 200, kVocab), generate(b, 200, kVocab));
}

TEST(Sampler, DrawIsPinnedToTheRawEngine) {
  // 16 equally likely tokens: token = floor(16 * u), u from the top 53 bits of mt19937_64. This
  // pins the mapping (no implementation-defined distribution), so results match across platforms.
  Sampler s(plain(123), 16);
  std::mt19937_64 ref(123);
  const std::vector<float> zeros(16, 0.0f);
  for (int i = 0; i < 100; ++i) {
    const double u = static_cast<double>(ref() >> 11) * 0x1.0p-53;
    ASSERT_EQ(s.sample(zeros), static_cast<int32_t>(u * 16)) << i;
  }
}

double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double chi2 = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double expected = probs[i] * n;
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

TEST(Sampler, FrequenciesMatchDistribution) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  constexpr int kDraws = 20000;
  Sampler s(plain(2024), 4);
  std::vector<int> counts(4, 0);
  for (int i = 0; i < kDraws; ++i) ++counts[static_cast<size_t>(s.sample(log_probs(probs)))];
  // 3 degrees of freedom: P(chi2 > 16.27) = 0.001.
  EXPECT_LT(chi_square(counts, probs, kDraws), 16.27);
  // A wrong distribution (uniform) must be rejected by the same test.
  EXPECT_GT(chi_square(counts, {0.25, 0.25, 0.25, 0.25}, kDraws), 16.27);
}

TEST(Sampler, TemperatureReshapesDistribution) {
  // temp 2 on log p gives p^(1/2) normalised.
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  std::vector<double> expected;
  double z = 0.0;
  for (double p : probs) z += std::sqrt(p);
  for (double p : probs) expected.push_back(std::sqrt(p) / z);
  SamplingParams params = plain(99);
  params.temp = 2.0f;
  Sampler s(params, 4);
  constexpr int kDraws = 20000;
  std::vector<int> counts(4, 0);
  for (int i = 0; i < kDraws; ++i) ++counts[static_cast<size_t>(s.sample(log_probs(probs)))];
  EXPECT_LT(chi_square(counts, expected, kDraws), 16.27);
  EXPECT_GT(chi_square(counts, probs, kDraws), 16.27);
}

TEST(Sampler, PenaltiesChangeGreedyChoice) {
  SamplingParams p;
  p.temp = 0.0f;
  p.repeat_penalty = 1.1f;  // 2.0 / 1.1 = 1.82 < 1.9
  Sampler s(p, 3);
  const std::vector<float> logits = {2.0f, 1.9f, 0.0f};
  EXPECT_EQ(s.sample(logits), 0);
  s.accept(0);
  EXPECT_EQ(s.sample(logits), 1);
  s.reset();
  EXPECT_EQ(s.sample(logits), 0);
}

TEST(Sampler, XtcRemovesTopChoicesWithItsProbability) {
  SamplingParams p;
  p.seed = 5;
  p.temp = 0.0f;  // greedy after XTC: shows which tokens XTC left
  p.top_p = 1.0f;
  p.xtc_threshold = 0.1f;
  const std::vector<float> logits = log_probs({0.5, 0.3, 0.15, 0.05});
  p.xtc_probability = 1.0f;
  Sampler always(p, 4);
  for (int i = 0; i < 20; ++i) ASSERT_EQ(always.sample(logits), 2);
  p.xtc_probability = 0.5f;
  Sampler half(p, 4);
  int removed = 0;
  for (int i = 0; i < 2000; ++i) removed += half.sample(logits) == 2 ? 1 : 0;
  EXPECT_GT(removed, 900);
  EXPECT_LT(removed, 1100);
}

TEST(Sampler, NegInfLogitsAreNeverPicked) {
  const float ninf = -std::numeric_limits<float>::infinity();
  Sampler s(plain(3), 3);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(s.sample(std::vector<float>{ninf, 0.0f, ninf}), 1);
}

TEST(Sampler, BadInputThrows) {
  Sampler s(plain(1), 3);
  EXPECT_TRUE(contains(error_of([&] { s.sample(std::vector<float>{1, 2}); }), "2 logits"));
  EXPECT_TRUE(contains(error_of([&] { s.sample(std::vector<float>{1, NAN, 2}); }), "token 1"));
  const float ninf = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(contains(error_of([&] { s.sample(std::vector<float>{ninf, ninf, ninf}); }), "-inf"));
  EXPECT_TRUE(contains(error_of([&] { s.accept(3); }), "token 3"));
  EXPECT_TRUE(contains(error_of([] { Sampler(plain(1), 0); }), "n_vocab"));
  SamplingParams bad = plain(1);
  bad.top_p = 2.0f;
  EXPECT_TRUE(contains(error_of([&] { Sampler(bad, 3); }), "top_p"));
}

TEST(Sampler, DryBreakersNeedVocabulary) {
  SamplingParams p = plain(1);
  p.dry_multiplier = 0.8f;
  EXPECT_TRUE(contains(error_of([&] { Sampler(p, 3); }), "dry_sequence_breakers"));
  DryVocab v;
  v.piece = [](int32_t t) { return std::string(1, static_cast<char>('a' + t)); };
  v.tokenize = [](std::string_view) { return std::vector<int32_t>{}; };
  EXPECT_NO_THROW(Sampler(p, 3, &v));
  p.dry_sequence_breakers.clear();
  EXPECT_NO_THROW(Sampler(p, 3));
}

TEST(Sampler, DryDiscouragesRepeatInChain) {
  SamplingParams p = plain(1);
  p.temp = 0.0f;
  p.dry_multiplier = 1.0f;
  p.dry_sequence_breakers.clear();
  Sampler s(p, 5);
  for (int32_t t : {0, 1, 2, 3, 0, 1}) s.accept(t);
  // Token 2 would continue "0 1 2": penalty 1 drops it below token 4.
  EXPECT_EQ(s.sample(std::vector<float>{0, 0, 2.0f, 0, 1.5f}), 4);
}

TEST(Sampler, RandomSeedIsResolved) {
  SamplingParams p = plain(kRandomSeed);
  Sampler s(p, 3);
  EXPECT_EQ(s.params().seed, kRandomSeed);
  // The drawn seed reproduces the sampler's stream.
  Sampler again(plain(s.seed()), 3);
  const std::vector<float> logits = {0, 0, 0};
  for (int i = 0; i < 20; ++i) ASSERT_EQ(s.sample(logits), again.sample(logits));
}

// A grammar's mask: only allowed tokens are ever drawn, whatever the chain and the seed.
TEST(Sampler, MaskLimitsTheDraw) {
  const int n_vocab = 300;
  std::vector<uint64_t> mask((n_vocab + 63) / 64, 0);
  const std::vector<int32_t> allowed = {3, 64, 65, 127, 299};
  for (int32_t id : allowed) mask[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    Sampler s(plain(seed), n_vocab);
    for (int step = 0; step < 10; ++step) {
      const int32_t t = s.sample(logits_for(step, n_vocab), mask);
      EXPECT_TRUE(std::find(allowed.begin(), allowed.end(), t) != allowed.end()) << t;
    }
  }
  SamplingParams greedy = plain(1);
  greedy.temp = 0.0f;
  Sampler g(greedy, n_vocab);
  const std::vector<float> l = logits_for(0, n_vocab);
  int32_t best = allowed[0];
  for (int32_t id : allowed) {
    if (l[static_cast<size_t>(id)] > l[static_cast<size_t>(best)]) best = id;
  }
  EXPECT_EQ(g.sample(l, mask), best);
  // Nothing allowed, or a mask of the wrong size: an error, never a token.
  std::vector<uint64_t> none(mask.size(), 0);
  EXPECT_NE(error_of([&] { g.sample(l, none); }).find("grammar allows no token"),
            std::string::npos);
  std::vector<uint64_t> short_mask(1, ~uint64_t{0});
  EXPECT_NE(error_of([&] { g.sample(l, short_mask); }).find("token mask"), std::string::npos);
}

// logprobs against a double-precision log-softmax of fresh random logits (with a bias and a
// mask): the top n in order, and the drawn token's own value.
TEST(Sampler, LogprobsMatchADoubleReference) {
  std::mt19937 rng(12345);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int n_vocab = 1000;
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<float> l(static_cast<size_t>(n_vocab));
    for (float& v : l) v = dist(rng);
    SamplingParams p = plain(static_cast<uint32_t>(trial + 1));
    p.top_k = 40;
    p.logit_bias = {{5, 4.0f}, {6, -INFINITY}};
    std::vector<uint64_t> mask((n_vocab + 63) / 64, ~uint64_t{0});
    mask[0] &= ~(uint64_t{1} << 9);  // token 9 masked out
    Sampler s(p, n_vocab);
    s.set_logprobs(7);
    const int32_t t = s.sample(l, mask);
    std::vector<double> x(l.begin(), l.end());
    x[5] += 4.0;
    std::vector<int32_t> ids;
    double m = -1e300;
    for (int i = 0; i < n_vocab; ++i) {
      if (i == 6 || i == 9) continue;
      ids.push_back(i);
      m = std::max(m, x[static_cast<size_t>(i)]);
    }
    double sum = 0;
    for (int32_t i : ids) sum += std::exp(x[static_cast<size_t>(i)] - m);
    const double lse = m + std::log(sum);
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return x[static_cast<size_t>(a)] > x[static_cast<size_t>(b)] ||
             (x[static_cast<size_t>(a)] == x[static_cast<size_t>(b)] && a < b);
    });
    const Logprobs& lp = s.last_logprobs();
    ASSERT_EQ(lp.top.size(), 7u);
    for (size_t k = 0; k < 7; ++k) {
      EXPECT_EQ(lp.top[k].id, ids[k]);
      EXPECT_NEAR(lp.top[k].logprob, x[static_cast<size_t>(ids[k])] - lse, 1e-4);
    }
    EXPECT_EQ(lp.token.id, t);
    EXPECT_NEAR(lp.token.logprob, x[static_cast<size_t>(t)] - lse, 1e-4);
  }
  Sampler s(plain(1), 10);
  EXPECT_NE(error_of([&] { s.set_logprobs(21); }).find("0..20"), std::string::npos);
}

}  // namespace
}  // namespace moe::sampling
