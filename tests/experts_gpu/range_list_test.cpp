// First-fit range bookkeeping against a byte map on random take/give sequences: no range is given
// out twice, freed ranges merge (a full give-back leaves one hole the whole size again).
#include "experts/gpu/range_list.h"

#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

namespace {

using moe::gpu::RangeList;

TEST(RangeList, TakesFirstFitAndMergesFreedNeighbours) {
  RangeList r(100);
  EXPECT_EQ(r.take(40), 0u);
  EXPECT_EQ(r.take(40), 40u);
  EXPECT_FALSE(r.take(21));
  EXPECT_EQ(r.take(20), 80u);
  r.give(0, 40);
  r.give(40, 40);
  EXPECT_EQ(r.take(80), 0u);  // the two neighbours merged
  r.give(80, 20);
  r.give(0, 80);
  EXPECT_EQ(r.take(100), 0u);
  EXPECT_FALSE(r.take(1));
}

TEST(RangeList, RandomTakesNeverOverlap) {
  constexpr uint64_t kSize = 4096;
  RangeList r(kSize);
  std::vector<int> owner(kSize, -1);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  std::mt19937 rng(11);
  for (int step = 0; step < 5000; ++step) {
    if (!live.empty() && (rng() % 2 == 0)) {
      const size_t i = rng() % live.size();
      const auto [off, n] = live[i];
      for (uint64_t b = off; b < off + n; ++b) owner[b] = -1;
      r.give(off, n);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    const uint64_t n = 1 + rng() % 200;
    const auto off = r.take(n);
    if (!off) continue;
    ASSERT_LE(*off + n, kSize);
    for (uint64_t b = *off; b < *off + n; ++b) {
      ASSERT_EQ(owner[b], -1) << "byte " << b << " given out twice";
      owner[b] = step;
    }
    live.emplace_back(*off, n);
  }
  for (const auto& [off, n] : live) r.give(off, n);
  EXPECT_EQ(r.take(kSize), 0u);
}

}  // namespace
