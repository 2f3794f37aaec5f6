// MissSplitProfiler: before both rates are measured it copies about half the misses (so both get
// measured); once measured it balances the CPU's part against the copies; it follows changed
// rates through its moving averages; old never copies none, new may; bad samples are ignored.
#include "coordinator/residency/miss_split_profiler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "common/error.h"

namespace {

using moe::model::MissSplitProfiler;

TEST(MissSplitProfiler, CopiesHalfUntilBothRatesAreMeasured) {
  MissSplitProfiler p(MissSplitProfiler::Mode::Old, 64);
  EXPECT_FALSE(p.calibrated());
  EXPECT_EQ(p.choose(0), 0);
  EXPECT_EQ(p.choose(1), 1);
  EXPECT_EQ(p.choose(2), 1);
  EXPECT_EQ(p.choose(7), 4);
  EXPECT_EQ(p.choose(8), 4);
  for (int i = 0; i <= MissSplitProfiler::kWarmup; ++i) p.record_cpu(6, 180);  // CPU only: half
  EXPECT_FALSE(p.calibrated());
  EXPECT_EQ(p.choose(8), 4);
  EXPECT_NE(p.summary().find("not measured yet"), std::string::npos) << p.summary();
}

TEST(MissSplitProfiler, BalancesTheCpuAgainstTheCopies) {
  MissSplitProfiler p(MissSplitProfiler::Mode::Old, 64);
  for (int i = 0; i < MissSplitProfiler::kWarmup; ++i) {
    p.record_cpu(6, 6 * 500.0);  // warm-up samples are dropped
    p.record_pcie(2, 2 * 500.0);
  }
  EXPECT_FALSE(p.calibrated());
  p.record_cpu(6, 6 * 25.0);   // 25 us per expert on the CPU
  p.record_pcie(2, 2 * 50.0);  // 50 us per expert over PCIe
  ASSERT_TRUE(p.calibrated());
  EXPECT_DOUBLE_EQ(p.cpu_us_per_expert(), 25.0);
  EXPECT_DOUBLE_EQ(p.pcie_us_per_expert(), 50.0);
  // q = m * 25 / 75: the q where 25 * (m - q) and 50 * q meet, rounded.
  for (int m = 1; m <= 32; ++m) {
    const int q = p.choose(m);
    const int want = std::max(1, static_cast<int>(std::lround(m / 3.0)));
    EXPECT_EQ(q, want) << "m " << m;
    // No other q gives a shorter visit than q +- rounding.
    const auto visit = [&](int k) { return std::max(25.0 * (m - k), 50.0 * k); };
    for (int k = 1; k <= m; ++k) EXPECT_LE(visit(q), visit(k) + 50.0) << "m " << m << " k " << k;
  }
  EXPECT_NE(p.summary().find("8 misses -> 3 copied"), std::string::npos) << p.summary();
  MissSplitProfiler few(MissSplitProfiler::Mode::Old, 2);  // two staging slots
  for (int i = 0; i <= MissSplitProfiler::kWarmup; ++i) {
    few.record_cpu(1, 100);
    few.record_pcie(1, 1);
  }
  EXPECT_EQ(few.choose(32), 2);
}

TEST(MissSplitProfiler, OldCopiesAtLeastOneNewMayCopyNone) {
  MissSplitProfiler old_p(MissSplitProfiler::Mode::Old, 64),
      new_p(MissSplitProfiler::Mode::New, 64);
  for (auto* p : {&old_p, &new_p}) {
    for (int i = 0; i <= MissSplitProfiler::kWarmup; ++i) {
      p->record_cpu(8, 8 * 10.0);  // a fast CPU
      p->record_pcie(1, 500.0);    // a slow link
    }
  }
  int explored = 0;
  for (int visit = 0; visit < 10 * MissSplitProfiler::kExploreEvery; ++visit) {
    const int m = 1 + visit % 8;
    EXPECT_EQ(old_p.choose(m), 1) << "m " << m;
    // Every kExploreEvery-th visit with m >= 2 copies one miss, to keep measuring the link.
    const int q = new_p.choose(m);
    EXPECT_LE(q, 1) << "m " << m;
    explored += q;
  }
  EXPECT_GT(explored, 0);
  EXPECT_LE(explored, 10);
}

TEST(MissSplitProfiler, FollowsChangedRatesThroughNoisySamples) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> noise(0.7, 1.3);  // one visit varies by tens of percent
  MissSplitProfiler p(MissSplitProfiler::Mode::New, 64);
  for (int i = 0; i < 200; ++i) {
    p.record_cpu(6, 6 * 20.0 * noise(rng));
    p.record_pcie(2, 2 * 60.0 * noise(rng));
  }
  EXPECT_EQ(p.choose(8), 2);  // 8 * 20 / 80
  EXPECT_NEAR(p.cpu_us_per_expert(), 20.0, 3.0);
  // The CPU slows down threefold (other work on the machine): copying more now pays.
  for (int i = 0; i < 200; ++i) {
    p.record_cpu(6, 6 * 60.0 * noise(rng));
    p.record_pcie(4, 4 * 60.0 * noise(rng));
  }
  EXPECT_EQ(p.choose(8), 4);  // 8 * 60 / 120
}

// A cold first CPU job (threads asleep) once measured 1,628 us per expert on the H200 host: the
// rule then copied every miss, the CPU was never timed again, and tg fell from 70 to 41 tok/s.
// Warm-up, the outlier cap and exploration bring the split back to the true rates.
TEST(MissSplitProfiler, RecoversFromAColdStart) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> noise(0.8, 1.2);
  MissSplitProfiler p(MissSplitProfiler::Mode::Old, 64);
  const double cpu = 40, pcie = 68;  // true rates: 8 misses -> 3 copied
  for (int visit = 0; visit < 3000; ++visit) {
    const int m = 8, q = p.choose(m);
    const double cold = visit < 6 ? 40.0 : 1.0;  // the first visits' CPU jobs are very slow
    if (q < m) p.record_cpu(m - q, (m - q) * cpu * cold * noise(rng));
    if (q > 0) p.record_pcie(q, q * pcie * noise(rng));
  }
  EXPECT_NEAR(p.cpu_us_per_expert(), cpu, 8.0);
  EXPECT_NEAR(p.pcie_us_per_expert(), pcie, 12.0);
  EXPECT_NE(p.summary().find("8 misses -> 3 copied"), std::string::npos) << p.summary();
}

TEST(MissSplitProfiler, IgnoresBadSamplesAndRejectsBadLimits) {
  MissSplitProfiler p(MissSplitProfiler::Mode::Old, 8);
  p.record_cpu(0, 100);
  p.record_cpu(4, -1);
  p.record_cpu(4, std::nan(""));
  p.record_pcie(-2, 100);
  p.record_pcie(2, std::numeric_limits<double>::infinity());
  EXPECT_FALSE(p.calibrated());
  EXPECT_THROW(MissSplitProfiler(MissSplitProfiler::Mode::Old, 0), moe::Error);
}

TEST(MissSplitProfiler, SeededRatesDecideTheFirstVisitAndAreRefined) {
  MissSplitProfiler p(MissSplitProfiler::Mode::New, 64);
  p.seed(-1, 30);  // a bad rate: nothing seeded
  EXPECT_FALSE(p.calibrated());
  p.seed(30, 90);  // CPU 3x faster per expert: a quarter of the misses cross PCIe
  ASSERT_TRUE(p.calibrated());
  EXPECT_EQ(p.choose(8), 2);
  // No warm-up after a seed: the very next samples move the averages.
  for (int i = 0; i < 64; ++i) {
    p.record_cpu(4, 4 * 90.0);
    p.record_pcie(2, 2 * 30.0);
  }
  EXPECT_NEAR(p.cpu_us_per_expert(), 90, 5);
  EXPECT_NEAR(p.pcie_us_per_expert(), 30, 5);
  EXPECT_EQ(p.choose(8), 6);
}

}  // namespace
