#include "coordinator/sampling/penalties.h"

#include <gtest/gtest.h>

#include "tests/sampling/test_util.h"

namespace moe::sampling {
namespace {

using test::make;

const std::vector<float> kLogits = {1.0f, 1.0f, 2.0f, -1.0f, 0.5f};

Penalties with_history(int32_t last_n, const std::vector<int32_t>& tokens) {
  Penalties p(last_n, 2.0f, 0.5f, 0.25f, 5);
  for (int32_t t : tokens) p.accept(t);
  return p;
}

TEST(Penalties, AppliesRepeatFrequencyPresenceToWindowTokens) {
  // Window of 4 over 1 2 2 3 2: token 1 has left it; counts 2 -> 3, 3 -> 1.
  const Penalties p = with_history(4, {1, 2, 2, 3, 2});
  EXPECT_EQ(p.count(1), 0);
  EXPECT_EQ(p.count(2), 3);
  EXPECT_EQ(p.count(3), 1);
  Candidates c = make(kLogits);
  p.apply(c);
  EXPECT_FLOAT_EQ(c.items[0].logit, 1.0f);    // never seen
  EXPECT_FLOAT_EQ(c.items[1].logit, 1.0f);    // out of the window
  EXPECT_FLOAT_EQ(c.items[2].logit, -0.75f);  // 2 / 2 - 3 * 0.5 - 0.25
  EXPECT_FLOAT_EQ(c.items[3].logit, -2.75f);  // -1 * 2 - 1 * 0.5 - 0.25 (negative: multiplied)
  EXPECT_FLOAT_EQ(c.items[4].logit, 0.5f);
}

TEST(Penalties, MinusOneWindowCoversAllHistory) {
  const Penalties p = with_history(-1, {1, 2, 2, 3, 2});
  Candidates c = make(kLogits);
  p.apply(c);
  EXPECT_FLOAT_EQ(c.items[1].logit, -0.25f);  // 1 / 2 - 0.5 - 0.25
  EXPECT_FLOAT_EQ(c.items[2].logit, -0.75f);
}

TEST(Penalties, ZeroWindowOrNeutralValuesAreOff) {
  const Penalties off = with_history(0, {1, 2, 2});
  Candidates c = make(kLogits);
  off.apply(c);
  for (size_t i = 0; i < kLogits.size(); ++i) EXPECT_EQ(c.items[i].logit, kLogits[i]);
  Penalties neutral(64, 1.0f, 0.0f, 0.0f, 5);
  neutral.accept(2);
  EXPECT_FALSE(neutral.enabled());
  EXPECT_TRUE(with_history(4, {}).enabled());
}

TEST(Penalties, ResetForgetsHistory) {
  Penalties p = with_history(4, {2, 2});
  p.reset();
  EXPECT_EQ(p.count(2), 0);
  Candidates c = make(kLogits);
  p.apply(c);
  EXPECT_EQ(c.items[2].logit, 2.0f);
}

}  // namespace
}  // namespace moe::sampling
