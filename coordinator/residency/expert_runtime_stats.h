// What a GPU forward's routed experts did since start, for GetStats, `moe-cli stats` and
// moe-bench: where the (token, expert) items ran, what crossed PCIe, how long each side was
// busy, the rates it measured, and the VRAM it holds. Plain data: the CPU-only forward has none.
#pragma once

#include <cstdint>
#include <string>

namespace moe::model {

struct ExpertRuntimeStats {
  // Items computed on VRAM copies (resident hits), on copies made over PCIe for them (decode
  // misses and prefill streams), and on the CPU.
  uint64_t items_vram = 0, items_pcie = 0, items_cpu = 0;
  uint64_t pcie_bytes = 0;  // expert weights copied host -> device
  // Decode misses copied over PCIe that stayed in the pool, and the experts they displaced.
  uint64_t admitted = 0, evictions = 0;
  double cpu_busy_ms = 0;  // the CPU's share of every layer (jobs on the runner thread)
  // The GPU's expert kernels of layers split with the CPU (from device events; layers routed
  // on the device are not timed), including any wait for their copies.
  double gpu_busy_ms = 0;
  // Hand-off waits (issue 29): the GPU stream waiting for host routing (host-routed split layers:
  // prefill, --moe-stream-share, --moe-host-routing), and the CPU share's runner waiting for the
  // routing of device-routed split layers (the GPU's attention and router before it).
  double gpu_route_wait_ms = 0, cpu_route_wait_ms = 0;
  // Measured rates: PCIe host -> device (the calibration, refined by decode copy timings), and
  // time per decode expert item on the CPU (at the pool's threads) and on the GPU; 0 = unknown.
  double pcie_gbps = 0, cpu_us_per_expert = 0, gpu_us_per_expert = 0;
  uint64_t vram_used_bytes = 0, vram_budget_bytes = 0;

  // For the decode bound: items of decode visits (batches of up to 4 tokens) and those of them
  // on VRAM copies; weight bytes in VRAM the dense part reads per token (attention, norms,
  // routers, output head); bytes of one routed expert and experts per token (layers x k); the
  // device's memory bandwidth (a device-to-device copy, read + write); whether decode misses
  // may cross PCIe.
  uint64_t decode_items = 0, decode_items_vram = 0;
  uint64_t dense_bytes = 0, expert_bytes = 0, experts_per_token = 0;
  double gpu_gbps = 0;
  bool pcie_lane = false;
};

// The decode bound of reference/performance.md §1 at the measured decode hit share h, with this
// machine's measured rates instead of datasheet ones:
//   T = D / B_g + max(h E / B_g, (1 - h) E / B_miss),   tok/s <= 1 / T,
// B_miss = B_cpu (+ B_pcie when misses cross PCIe), B_cpu = one expert's bytes per the CPU's
// time per expert. The hand-off term is left out (it is ours to minimise, not the machine's).
struct DecodeBound {
  double tok_s = 0;  // 0: a rate or the decode share is unknown
  double h = 0, cpu_gbps = 0, miss_gbps = 0;
};
DecodeBound decode_bound(const ExpertRuntimeStats& s);
// "76.1 tok/s = 33% of the decode bound 230 tok/s (h 0.59; dense 0.82 GB and experts 1.10 GB
// per token; GPU 4000 GB/s, misses at 48 GB/s CPU + 45 GB/s PCIe)", or "" without a bound.
std::string describe_against_bound(double tok_s, const ExpertRuntimeStats& s);

}  // namespace moe::model
