// LayerStats through InstrumentedExperts: CPU batches count calls, tokens and misses; a GPU
// forward's note_split adds hits, and counts the batch itself only when the CPU got no items
// (so a batch is counted once either way); out-of-range layers are ignored.
#include "coordinator/engine/layer_stats.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace {

using moe::engine::InstrumentedExperts;
using moe::engine::LayerStats;
using moe::model::ExpertItem;

class CountingExecutor : public moe::model::ExpertExecutor {
 public:
  void run(int64_t, const float*, int64_t, std::span<const ExpertItem>, float*) override { ++runs; }
  void note_split(int64_t, int64_t, int64_t gpu, int64_t) override { noted += gpu; }
  int runs = 0;
  int64_t noted = 0;
};

TEST(LayerStats, GpuSplitAddsHitsAndCountsEachBatchOnce) {
  LayerStats stats(2);
  auto inner = std::make_unique<CountingExecutor>();
  CountingExecutor* raw = inner.get();
  InstrumentedExperts experts(std::move(inner), stats);
  const std::vector<ExpertItem> three = {{0, 1, 0.5f}, {0, 2, 0.5f}, {1, 3, 1.f}};
  // Layer 0: a 2-token batch, 5 items on the GPU and 3 on the CPU.
  experts.note_split(0, 2, 5, 3);
  experts.run(0, nullptr, 2, three, nullptr);
  // Layer 1: a 1-token batch entirely on the GPU (run() is not called).
  experts.note_split(1, 1, 8, 0);
  // Layer 7 does not exist.
  experts.note_split(7, 1, 8, 0);
  const auto s = stats.snapshot();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].calls, 1u);
  EXPECT_EQ(s[0].tokens, 2u);
  EXPECT_EQ(s[0].gpu_hits, 5u);
  EXPECT_EQ(s[0].gpu_misses, 3u);
  EXPECT_EQ(s[0].routed, 8u);
  EXPECT_EQ(s[1].calls, 1u);
  EXPECT_EQ(s[1].tokens, 1u);
  EXPECT_EQ(s[1].gpu_hits, 8u);
  EXPECT_EQ(s[1].gpu_misses, 0u);
  EXPECT_EQ(s[1].routed, 8u);
  EXPECT_EQ(s[1].expert_ms, 0.0);
  // The wrapper passes both calls on.
  EXPECT_EQ(raw->runs, 1);
  EXPECT_EQ(raw->noted, 5 + 8 + 8);
}

TEST(LayerStats, WithoutAGpuEveryItemIsAMiss) {
  LayerStats stats(1);
  InstrumentedExperts experts(std::make_unique<CountingExecutor>(), stats);
  const std::vector<ExpertItem> two = {{0, 1, 1.f}, {0, 2, 1.f}};
  for (int i = 0; i < 4; ++i) experts.run(0, nullptr, 1, two, nullptr);
  const auto s = stats.snapshot();
  EXPECT_EQ(s[0].calls, 4u);
  EXPECT_EQ(s[0].routed, 8u);
  EXPECT_EQ(s[0].gpu_misses, 8u);
  EXPECT_EQ(s[0].gpu_hits, 0u);
}

}  // namespace
