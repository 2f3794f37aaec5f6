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

}  // namespace
