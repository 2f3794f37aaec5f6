// PrefetchTuner: the faster candidate by median rate, ties to the default, round-robin trials,
// bad samples ignored; and the process-wide trials the GEMVs drive settle on a candidate.
#include "kernels/cpu/weight_prefetch.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace moe::cpu {
namespace {

TEST(PrefetchTuner, KeepsTheFasterMedianDespiteOutliers) {
  PrefetchTuner t({6144, 2048}, 5);
  EXPECT_FALSE(t.decided());
  EXPECT_EQ(t.chosen(), 6144u);  // the default until decided
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> jitter(0.95, 1.05);
  for (int i = 0; i < 10; ++i) {
    const int c = t.next();
    ASSERT_EQ(c, i % 2);  // round robin
    // 2048 is 30% faster, but two of its samples are page-fault slow and one of 6144's is fast.
    double rate = (c == 1 ? 26e9 : 20e9) * jitter(rng);
    if (c == 1 && i < 4) rate = 5e9;
    if (c == 0 && i == 8) rate = 40e9;
    t.record(c, rate);
  }
  ASSERT_TRUE(t.decided());
  EXPECT_EQ(t.chosen(), 2048u);
  EXPECT_EQ(t.next(), -1);
  EXPECT_NE(t.summary().find("2048 bytes, measured"), std::string::npos) << t.summary();
}

TEST(PrefetchTuner, TiesGoToTheDefaultAndBadSamplesAreIgnored) {
  PrefetchTuner t({6144, 2048, 1024}, 2);
  t.record(0, 10e9);
  t.record(1, 0.0);   // not a rate
  t.record(2, -1.0);  // not a rate
  t.record(7, 99e9);  // no such candidate
  t.record(1, 10e9);
  t.record(2, 10e9);
  EXPECT_FALSE(t.decided());  // candidates 1 and 2 have one valid sample each
  t.record(0, 10e9);
  t.record(1, 10e9);
  t.record(2, 10e9);
  ASSERT_TRUE(t.decided());
  EXPECT_EQ(t.chosen(), 6144u);
  EXPECT_THROW(PrefetchTuner({}, 3), std::exception);
  EXPECT_THROW(PrefetchTuner({6144}, 0), std::exception);
}

// Single-row GEMVs over at least kPrefetchTrialMinBytes are trials; enough of them decide the
// process's distance, which is then one of the candidates (MOE_PREFETCH_AHEAD unset, as in CI).
TEST(WeightPrefetch, LargeGemvsSettleTheProcessDistance) {
  ThreadPool pool(2);
  MatmulScratch scratch;
  constexpr int64_t kNIn = 4096;
  const int64_t n_out = static_cast<int64_t>(kPrefetchTrialMinBytes / (kNIn * 2)) + 1;  // F16
  std::vector<uint16_t> w(static_cast<size_t>(kNIn * n_out), 0x3c00);                   // 1.0
  const WeightMatrix m = make_weight_matrix(GgmlType::F16, w.data(), kNIn, n_out);
  std::vector<float> x(kNIn, 0.5f), y(static_cast<size_t>(n_out));
  std::vector<float> y8(static_cast<size_t>(n_out) * 8), x8(kNIn * 8, 0.5f);
  matmul(m, x8.data(), 8, y8.data(), pool, scratch, best_isa());  // several rows: no trial
  EXPECT_FALSE(prefetch_tuned());
  for (int i = 0; i < 200 && !prefetch_tuned(); ++i) {
    matmul(m, x.data(), 1, y.data(), pool, scratch, best_isa());
    ASSERT_FLOAT_EQ(y[static_cast<size_t>(n_out) - 1], 0.5f * kNIn);
  }
  ASSERT_TRUE(prefetch_tuned()) << prefetch_summary();
  const uintptr_t d = weight_prefetch_ahead();
  EXPECT_TRUE(d == 6144 || d == 2048) << d;
  EXPECT_NE(prefetch_summary().find("measured"), std::string::npos) << prefetch_summary();
}

}  // namespace
}  // namespace moe::cpu
