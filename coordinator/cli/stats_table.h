// GetStats, GetPlacement and the expert policy for people (a table) and for programs (one JSON
// object).
#pragma once

#include <string>

#include "moe/v1/control.pb.h"

namespace moe::cli {

// The counters, the queue, the token throughput and one row per worker (stats joined with its
// placement by worker_id): state, pid, restarts, heartbeat age, NUMA node, threads, CPUs.
std::string format_stats_table(const moe::v1::GetStatsResponse& stats,
                               const moe::v1::GetPlacementResponse& placement);

// One row per MoE layer: expert batches, tokens, routed items, GPU hits and CPU-computed misses,
// hit rate and expert time, and from the placement where the layer's experts are now (in VRAM /
// read in place over PCIe / on the CPU; "" when the server reports no layers).
std::string format_layer_table(const moe::v1::GetStatsResponse& stats,
                               const moe::v1::GetPlacementResponse& placement);
// The routed experts' runtime figures (GPU forwards): item split, PCIe, busy time, rates, VRAM.
std::string format_expert_runtime(const moe::v1::GetStatsResponse& stats);

// {"stats": GetStatsResponse, "placement": GetPlacementResponse} in proto3 JSON with the .proto
// field names (64-bit counters are strings, as that mapping writes them), on one line.
std::string format_stats_json(const moe::v1::GetStatsResponse& stats,
                              const moe::v1::GetPlacementResponse& placement);

// The routed experts' live policy (pool, shares, profiler, grouping) and, from the placement,
// one row per MoE layer: where its experts are (VRAM, read in place over PCIe, CPU).
std::string format_policy(const moe::v1::ExpertPolicyResponse& policy,
                          const moe::v1::GetPlacementResponse& placement);
// {"policy": ExpertPolicyResponse, "layers": [LayerPlacement...]} on one line.
std::string format_policy_json(const moe::v1::ExpertPolicyResponse& policy,
                               const moe::v1::GetPlacementResponse& placement);

}  // namespace moe::cli
