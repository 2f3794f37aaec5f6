// moe-cli stats: the routed experts' runtime block is printed from GetStats' ExpertRuntime (GPU
// forwards) with its shares, rates and VRAM, and left out when the server has none (CPU only).
#include <gtest/gtest.h>

#include <string>

#include "coordinator/cli/stats_table.h"
#include "moe/v1/control.pb.h"

namespace {

using moe::cli::format_expert_runtime;

TEST(CliStats, ExpertRuntimeBlockShowsSharesRatesAndVram) {
  moe::v1::GetStatsResponse s;
  EXPECT_EQ(format_expert_runtime(s), "");
  moe::v1::ExpertRuntime& x = *s.mutable_experts();
  x.set_items_vram(300);
  x.set_items_pcie(100);
  x.set_items_cpu(600);
  x.set_pcie_bytes(uint64_t{3} << 29);  // 1.5 GiB
  x.set_admitted(12);
  x.set_evictions(7);
  x.set_cpu_busy_ms(2500);
  x.set_gpu_busy_ms(125);
  x.set_pcie_gbps(47.8);
  x.set_cpu_us_per_expert(20.6);
  x.set_gpu_route_wait_ms(226);
  x.set_cpu_route_wait_ms(714);
  x.set_vram_used_bytes(uint64_t{5617} << 20);
  x.set_vram_budget_bytes(uint64_t{6144} << 20);
  const std::string t = format_expert_runtime(s);
  EXPECT_NE(t.find("30.0% on VRAM copies, 10.0% copied over PCIe, 60.0% on the CPU (1000 in all)"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("PCIe: 1.50 GiB copied, 47.8 GB/s; 12 misses admitted into the pool, 7 "
                   "evictions"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("busy: CPU share 2.50 s, GPU experts (split layers) 0.12 s"), std::string::npos)
      << t;
  EXPECT_NE(t.find("per expert: CPU 20.6 us, GPU -"), std::string::npos) << t;  // GPU unmeasured
  EXPECT_NE(t.find("waits: GPU for host routing 0.23 s, CPU share for device routing 0.71 s"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("VRAM: 5617 of 6144 MiB"), std::string::npos) << t;
}

// The per-layer table joins each layer's counters with where its experts are now (GetPlacement):
// in VRAM / read in place / on the CPU; a layer the placement does not list shows "-".
TEST(CliStats, LayerTableShowsEachLayersExpertSplit) {
  moe::v1::GetStatsResponse s;
  moe::v1::GetPlacementResponse p;
  EXPECT_EQ(moe::cli::format_layer_table(s, p), "");
  for (int32_t l = 0; l < 2; ++l) {
    moe::v1::LayerStats& o = *s.add_layers();
    o.set_layer(l);
    o.set_calls(10);
    o.set_tokens(12);
    o.set_routed(96);
    o.set_gpu_hits(l == 0 ? 72 : 0);
    o.set_gpu_misses(l == 0 ? 24 : 96);
    o.set_expert_ms(1500);
  }
  moe::v1::LayerPlacement& l0 = *p.add_layers();
  l0.set_layer(0);
  l0.set_vram(40);
  l0.set_direct(30);
  l0.set_cpu(58);
  const std::string t = moe::cli::format_layer_table(s, p);
  EXPECT_NE(t.find("EXPERTS VRAM/DIRECT/CPU"), std::string::npos) << t;
  const size_t row0 = t.find("\n    0 ");
  ASSERT_NE(row0, std::string::npos) << t;
  const std::string line0 = t.substr(row0 + 1, t.find('\n', row0 + 1) - row0 - 1);
  EXPECT_NE(line0.find("75.0"), std::string::npos) << line0;
  EXPECT_NE(line0.find("1.50 s"), std::string::npos) << line0;
  EXPECT_EQ(line0.substr(line0.size() - 8), "40/30/58") << line0;
  const size_t row1 = t.find("\n    1 ");
  ASSERT_NE(row1, std::string::npos) << t;
  const std::string line1 = t.substr(row1 + 1, t.find('\n', row1 + 1) - row1 - 1);
  EXPECT_EQ(line1.back(), '-') << line1;
}

}  // namespace
