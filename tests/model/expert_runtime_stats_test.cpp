// decode_bound(): reference/performance.md §1 with measured rates. Anchored on the reference's
// own table (§3.3, H200, h = 0.25, misses at 128 GB/s CPU + PCIe: 151 tok/s), then the max()
// switching sides, the PCIe lane, and no bound without the rates or decode items.
#include "coordinator/residency/expert_runtime_stats.h"

#include <gtest/gtest.h>

namespace {

using moe::model::decode_bound;
using moe::model::describe_against_bound;
using moe::model::ExpertRuntimeStats;

// Qwen3-30B-A3B Q4_K_M on the H200 host: D = 0.86 GB, E = 48 x 8 experts of 2.854 MB (1.096 GB),
// 4,240 GB/s device copy; the CPU at 80 GB/s and PCIe at 48 GB/s make the reference's 128.
ExpertRuntimeStats h200(double h) {
  ExpertRuntimeStats s;
  s.dense_bytes = 860'000'000;
  s.expert_bytes = 2'854'167;
  s.experts_per_token = 384;
  s.gpu_gbps = 4240;
  s.cpu_us_per_expert = 2'854'167 / (80.0 * 1e3);  // 80 GB/s
  s.pcie_gbps = 48;
  s.pcie_lane = true;
  s.decode_items = 1000;
  s.decode_items_vram = static_cast<uint64_t>(h * 1000);
  return s;
}

TEST(DecodeBound, MatchesTheReferenceTable) {
  const auto b = decode_bound(h200(0.25));
  EXPECT_NEAR(b.h, 0.25, 1e-12);
  EXPECT_NEAR(b.miss_gbps, 128, 1e-9);
  EXPECT_NEAR(b.tok_s, 151, 1.0);
  // Without the PCIe lane the misses run at the CPU's 80 GB/s only.
  ExpertRuntimeStats cpu_only = h200(0.25);
  cpu_only.pcie_lane = false;
  EXPECT_NEAR(decode_bound(cpu_only).miss_gbps, 80, 1e-9);
  EXPECT_LT(decode_bound(cpu_only).tok_s, b.tok_s);
}

TEST(DecodeBound, TheSlowerSideOfTheLayerDecides) {
  // All hits: only the GPU terms remain, (D + E) / B_g.
  const auto all = decode_bound(h200(1.0));
  EXPECT_NEAR(all.tok_s, 4240e9 / (860e6 + 384 * 2'854'167.0), 1.0);
  // More hits, never slower.
  double last = 0;
  for (const double h : {0.0, 0.3, 0.6, 0.9, 0.99}) {
    const double t = decode_bound(h200(h)).tok_s;
    EXPECT_GT(t, last) << h;
    last = t;
  }
}

TEST(DecodeBound, NoBoundWithoutRatesOrDecodeItems) {
  ExpertRuntimeStats s = h200(0.5);
  s.decode_items = 0;
  s.decode_items_vram = 0;
  EXPECT_EQ(decode_bound(s).tok_s, 0);
  EXPECT_EQ(describe_against_bound(50, s), "");
  s = h200(0.5);
  s.gpu_gbps = 0;
  EXPECT_EQ(decode_bound(s).tok_s, 0);
  s = h200(0.5);
  s.cpu_us_per_expert = 0;
  EXPECT_EQ(decode_bound(s).tok_s, 0);
}

TEST(DecodeBound, DescribesTheResultAsAShareOfTheBound) {
  const ExpertRuntimeStats s = h200(0.25);
  const std::string d = describe_against_bound(75.5, s);
  EXPECT_NE(d.find("75.5 tok/s = 50% of the decode bound 151 tok/s"), std::string::npos) << d;
  EXPECT_NE(d.find("h 0.25"), std::string::npos) << d;
  EXPECT_NE(d.find("misses at 80 GB/s CPU + 48 GB/s PCIe"), std::string::npos) << d;
}

}  // namespace
