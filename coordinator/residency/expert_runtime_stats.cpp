#include "coordinator/residency/expert_runtime_stats.h"

#include <algorithm>
#include <cstdio>

namespace moe::model {

DecodeBound decode_bound(const ExpertRuntimeStats& s) {
  DecodeBound b;
  if (s.decode_items == 0 || s.gpu_gbps <= 0 || s.cpu_us_per_expert <= 0 || s.expert_bytes == 0) {
    return b;
  }
  b.h = static_cast<double>(s.decode_items_vram) / static_cast<double>(s.decode_items);
  b.cpu_gbps = static_cast<double>(s.expert_bytes) / (s.cpu_us_per_expert * 1e3);
  b.miss_gbps = b.cpu_gbps + (s.pcie_lane ? s.pcie_gbps : 0.0);
  const double e = static_cast<double>(s.expert_bytes) * static_cast<double>(s.experts_per_token);
  const double gpu = s.gpu_gbps * 1e9, miss = b.miss_gbps * 1e9;
  const double t =
      static_cast<double>(s.dense_bytes) / gpu + std::max(b.h * e / gpu, (1 - b.h) * e / miss);
  b.tok_s = 1.0 / t;
  return b;
}

std::string describe_against_bound(double tok_s, const ExpertRuntimeStats& s) {
  const DecodeBound b = decode_bound(s);
  if (b.tok_s <= 0) return {};
  char pcie[48] = "";
  if (s.pcie_lane) std::snprintf(pcie, sizeof pcie, " + %.0f GB/s PCIe", s.pcie_gbps);
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%.1f tok/s = %.0f%% of the decode bound %.0f tok/s (h %.2f; dense %.2f GB and "
                "experts %.2f GB per token; GPU %.0f GB/s, misses at %.0f GB/s CPU%s)",
                tok_s, 100.0 * tok_s / b.tok_s, b.tok_s, b.h,
                static_cast<double>(s.dense_bytes) / 1e9,
                static_cast<double>(s.expert_bytes * s.experts_per_token) / 1e9, s.gpu_gbps,
                b.cpu_gbps, pcie);
  return buf;
}

}  // namespace moe::model
