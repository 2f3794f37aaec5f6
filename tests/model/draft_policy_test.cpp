// DraftPolicy, the cost model of speculative decoding, on made-up measurements: it drafts long
// when batching is cheap and drafts stand, not at all when a step costs its tokens' worth or
// drafts fail, tries a 1-token draft once before anything is known about batches, and follows a
// change of acceptance within tens of steps.
#include "coordinator/model/draft_policy.h"

#include <gtest/gtest.h>

namespace {

using moe::model::DraftPolicy;

// `steps` steps of each size n in 1..n_max at a + b (n - 1) seconds, and drafts of `k` tokens
// of which the first `stood` stand.
void feed(DraftPolicy& p, int n_max, double a, double b, int steps, int k, int stood) {
  for (int s = 0; s < steps; ++s) {
    for (int n = 1; n <= n_max; ++n) p.observe_step(n, a + b * (n - 1));
    p.observe_drafts(k, stood);
  }
}

TEST(DraftPolicy, NothingBeforeAStepIsTimed) {
  DraftPolicy p(8);
  EXPECT_EQ(p.length(8), 0);
  EXPECT_DOUBLE_EQ(p.acceptance(), 0.5);  // the prior
  EXPECT_EQ(p.length(0), 0);
}

TEST(DraftPolicy, TriesOneDraftWhenOnlySingleStepsAreKnown) {
  DraftPolicy p(8);
  p.observe_step(1, 0.010);
  EXPECT_DOUBLE_EQ(p.step_seconds(2), 0.010);  // assumed free, to be measured
  EXPECT_DOUBLE_EQ(p.step_seconds(5), 0.050);  // assumed a full step per token
  EXPECT_EQ(p.length(8), 1);
}

TEST(DraftPolicy, DraftsLongWhenBatchesAreCheapAndDraftsStand) {
  DraftPolicy p(8);
  feed(p, 9, 0.010, 0.0005, 20, 8, 8);  // every draft stands; a token adds 5% of a step
  EXPECT_GT(p.acceptance(), 0.9);
  EXPECT_EQ(p.length(8), 8);
  EXPECT_EQ(p.length(3), 3);  // no more than there is
  DraftPolicy capped(2);
  feed(capped, 9, 0.010, 0.0005, 20, 8, 8);
  EXPECT_EQ(capped.length(8), 2);  // nor more than draft_max
}

TEST(DraftPolicy, StopsWhenAStepCostsItsTokensOrDraftsFail) {
  DraftPolicy costly(8);
  feed(costly, 9, 0.010, 0.010, 20, 8, 6);  // 75% stand, but each token costs a whole step
  EXPECT_EQ(costly.length(8), 0);
  DraftPolicy failing(8);
  feed(failing, 9, 0.010, 0.002, 20, 4, 0);  // cheap batches, nothing stands
  EXPECT_LT(failing.acceptance(), 0.1);
  EXPECT_EQ(failing.length(8), 0);
}

TEST(DraftPolicy, InterpolatesUnmeasuredSizesOnTheMeasuredLine) {
  DraftPolicy p(8);
  for (int s = 0; s < 10; ++s) {
    p.observe_step(1, 0.010);
    p.observe_step(3, 0.014);
  }
  EXPECT_NEAR(p.step_seconds(2), 0.012, 1e-9);
  EXPECT_NEAR(p.step_seconds(9), 0.026, 1e-9);
  EXPECT_NEAR(p.expected_tokens(0), 1.0, 1e-12);
  p.observe_drafts(4, 4);
  const double q = p.acceptance();
  EXPECT_NEAR(p.expected_tokens(2), 1.0 + q + q * q, 1e-12);
}

TEST(DraftPolicy, FollowsAChangeOfAcceptance) {
  DraftPolicy p(8);
  feed(p, 9, 0.010, 0.001, 30, 8, 8);
  EXPECT_EQ(p.length(8), 8);
  // The text changes and every draft now fails at its first token; the loop as
  // generate_speculative runs it (a step of k + 1 tokens, or one token and the draft's first
  // token compared with the chosen one). Each token in a batch costs 10% of a step, so a draft
  // pays while more than ~10% stand: drafting stops within ~100 steps and does not resume.
  int stopped_at = -1;
  for (int step = 0; step < 200; ++step) {
    const int k = p.length(8);
    p.observe_step(k + 1, 0.010 + 0.001 * k);
    p.observe_drafts(k > 0 ? k : 1, 0);
    if (k == 0 && stopped_at < 0) stopped_at = step;
    if (stopped_at >= 0) {
      EXPECT_EQ(k, 0) << "step " << step;
    }
  }
  EXPECT_GE(stopped_at, 0);
  EXPECT_LT(stopped_at, 120);
  // Repetitive text again: the first drafted token, compared while drafting is off, now matches
  // the chosen one, and drafting resumes.
  int resumed_at = -1;
  for (int step = 0; step < 200 && resumed_at < 0; ++step) {
    const int k = p.length(8);
    p.observe_step(k + 1, 0.010 + 0.001 * k);
    p.observe_drafts(k > 0 ? k : 1, k > 0 ? k : 1);
    if (k > 0) resumed_at = step;
  }
  EXPECT_GE(resumed_at, 0);
  EXPECT_LT(resumed_at, 60);
  for (int step = 0; step < 100; ++step) {
    const int k = p.length(8);
    p.observe_step(k + 1, 0.010 + 0.001 * k);
    p.observe_drafts(k > 0 ? k : 1, k > 0 ? k : 1);
  }
  EXPECT_EQ(p.length(8), 8);
  // Failing again, to leave it off for the checks below.
  for (int step = 0; step < 200; ++step) {
    const int k = p.length(8);
    p.observe_step(k + 1, 0.010 + 0.001 * k);
    p.observe_drafts(k > 0 ? k : 1, 0);
  }
  EXPECT_EQ(p.length(8), 0);
  // Ignored: nonsense sizes and times.
  p.observe_step(0, 1.0);
  p.observe_step(DraftPolicy::kMaxDraft + 2, 1.0);
  p.observe_step(2, -1.0);
  p.observe_drafts(0, 0);
  EXPECT_EQ(p.length(8), 0);
}

}  // namespace
