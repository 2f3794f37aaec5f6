// What a GPU forward's routed experts did since start, for GetStats, `moe-cli stats` and
// moe-bench: where the (token, expert) items ran, what crossed PCIe, how long each side was
// busy, the rates it measured, and the VRAM it holds. Plain data: the CPU-only forward has none.
#pragma once

#include <cstdint>

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
  // Measured rates: PCIe host -> device (the calibration, refined by decode copy timings), and
  // time per decode expert item on the CPU (at the pool's threads) and on the GPU; 0 = unknown.
  double pcie_gbps = 0, cpu_us_per_expert = 0, gpu_us_per_expert = 0;
  uint64_t vram_used_bytes = 0, vram_budget_bytes = 0;
};

}  // namespace moe::model
