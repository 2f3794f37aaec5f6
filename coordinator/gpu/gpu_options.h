// Where the model's parts live on a GPU machine, with llama.cpp's flag names where users know
// them (-ngl, -cmoe, -ncmoe). Plain data: tools that are built without CUDA parse it too and
// report a clear error when it asks for a GPU.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "common/gguf.h"
#include "common/mapped_file.h"
#include "common/memory_info.h"
#include "coordinator/model/kv_cache.h"

namespace moe::gpu {

struct GpuOptions {
  // -ngl: 0 keeps everything on the CPU; >= the model's layer count puts attention, norms,
  // router, output head and the KV cache of every layer in VRAM (partial offload is refused).
  int64_t n_gpu_layers = 0;
  int device = 0;
  // Cap on everything allocated on the GPU; 0 = the device's free memory at start.
  int64_t vram_budget_mib = 0;
  // -cmoe: every layer's routed experts are homed on the CPU.
  bool cpu_moe = false;
  // -ncmoe N: the routed experts of the first N layers are homed on the CPU (llama.cpp's
  // --n-cpu-moe keeps the first N layers' MoE weights in host memory).
  int64_t n_cpu_moe = 0;
  // Pool of whole-expert slots for CPU-homed experts: < 0 = auto (what the budget leaves after
  // everything else and a reserve), 0 = no pool, > 0 = that many MiB.
  int64_t moe_resident_mib = -1;
  // Share (0..1) of a decode step's CPU-homed misses per layer whose weights are copied over PCIe
  // into VRAM staging slots and computed on the GPU while the CPU computes the rest (FreeToken's
  // q = m * B_pcie / (B_pcie + B_cpu)); 0 (default): the CPU computes every miss; < 0
  // (--moe-stream-share auto): that rule with the CPU and PCIe rates measured as it runs.
  double moe_stream_share = 0.0;
  // Share (0..1) of each device-routed decode layer's expected CPU-homed misses that the GPU's
  // kernels read in place from the page-locked model over PCIe (no copy, no host in the loop)
  // while the CPU computes the rest: the layer's hottest experts without a pool slot, as many as
  // carry that share of its routing. < 0 (default, auto): t_cpu / (t_cpu + t_pcie) from the
  // calibrated time per expert on the CPU and over PCIe, when the model is read in and page-locked
  // and decode routes on the GPU; 0: none. A share > 0 needs the model read in.
  double moe_direct_share = -1;
  // Prefill batches that stream their CPU-homed experts over PCIe: the share (0..1) of a layer's
  // streamed experts that the CPU computes instead, at the same time (the least routed ones).
  // Default 0.2: the least routed experts have few tokens, so the CPU computes them in about a
  // copy's time, and the link carries 20% less (0.2-0.3 measured best on the H200 host,
  // docs/performance-log.md); 0: all stream; < 0 (--moe-prefill-cpu-share auto): m * t_gpu / (t_gpu
  // + t_cpu) of the m experts, with each side's time per expert measured on the previous layers.
  double moe_prefill_cpu_share = 0.2;
  // --moe-resident-profiler, for --moe-stream-share auto: "old" copies at least one miss per
  // decode layer visit (the fork's default), "new" none when the rates say the CPU alone is faster.
  bool moe_profiler_new = false;
  // --moe-resident-grouping layout: each CPU-homed layer owns a contiguous range of the pool's
  // slots, sized by the layer's share of the routing, and its misses evict only its own experts;
  // off (default): one pool across all layers, the coldest expert anywhere is evicted.
  bool moe_grouping_layout = false;
  // VRAM slots experts streamed over PCIe are copied into (decode misses, prefill batches);
  // even, at least 2.
  int64_t moe_staging_slots = 128;
  // Experts per chunk of a prefill's stream: the slots are a ring of chunks, each copied as soon
  // as the chunk it held has been computed, and computed once it is in VRAM (0: half the slots,
  // double buffering). Divides moe_staging_slots into at least two chunks. 128 slots in chunks of
  // 16 measured best on the H200 host (docs/performance-log.md); a smaller slot count given alone
  // gets chunks of at most half of it.
  int64_t moe_staging_chunk = 16;
  // Copy streams a prefill's chunks go round (--moe-copy-streams): each copy has a fixed cost
  // beyond its bytes (a 1 MiB copy moves at 48 GB/s where 14 MiB reach 55 on the H200 host), and
  // copies on different streams can overlap it.
  int64_t moe_copy_streams = 1;
  // 0 (--no-mmap, -mmp 0): read the model into memory instead of mapping it. With CPU-homed
  // experts the GPU then page-locks it, so prefill batches stream experts over PCIe and decode
  // reads a share of its misses in place. 1 (--mmap, -mmp 1): map it. -1 (default): read it in
  // when the GPU has CPU-homed experts and it fits in available memory, else map it
  // (choose_load_mode()).
  int mmap = -1;
  // --moe-cpu-sync: compute the CPU's expert share on the thread that drives the GPU, with a host
  // synchronisation per layer, instead of on a runner thread the GPU stream waits on (the
  // behaviour before the hand-off, kept for comparison and for drivers without stream waits).
  bool moe_cpu_sync = false;
  // --moe-host-routing: route every decode layer split between the GPU and the CPU, and every
  // batch of more than 4 tokens, on the host (router logits copied back, a stream synchronisation
  // per layer), as before device routing; kept for comparison. Default: a split decode layer
  // routes on the GPU, which publishes the routing to the CPU share through page-locked memory and
  // runs its hits at once, and a batch on a layer whose experts are all in VRAM is routed and
  // grouped by expert on the GPU.
  bool moe_host_routing = false;
  // --moe-profile FILE: the routing profile is loaded from FILE at start (the pool then starts
  // with the experts routed most in earlier runs) and saved to it as it grows and at exit.
  std::string moe_profile;
  // --recalibrate: measure the machine's rates (PCIe, GPU and CPU time per expert) at start even
  // when the calibration cache holds them for this machine and model.
  bool recalibrate = false;
  // Decode steps whose experts are all routed on the GPU (every expert in VRAM) replay one CUDA
  // graph per sequence instead of launching ~20 kernels per layer; --no-cuda-graphs launches them
  // one by one (llama.cpp: GGML_CUDA_DISABLE_GRAPHS).
  bool cuda_graphs = true;
  // --gpu-executor: "in-process" runs the routed experts' kernels on the coordinator's stream;
  // "process" in a moe-gpu-worker process (DESIGN.md §3), which needs MPS to be fast.
  std::string gpu_executor = "in-process";
  // -np: the sequences decoded together (ModelArch::forward_batch); each gets a VRAM slot, and
  // one more is kept for the engine's health probe.
  int64_t n_seq = 1;
  // Context per sequence the KV cache is sized for when the pool is sized automatically (every
  // one of the n_seq sequences gets this much).
  int64_t n_ctx = 4096;
  // The KV cache types the sequences will use: the VRAM the expert pool leaves for them.
  model::KvConfig kv;
};

// Spin of the CPU thread pool when the model runs on a GPU (tools' default unless --pool-spin is
// given): the pool idles while the GPU computes each layer's attention (~0.1 ms), and a pool that
// fell asleep pays a futex wake of every thread per layer. Measured on the H200 host, 16 threads,
// -cmoe: tg 24 tok/s with the CPU default spin, 36 with this (docs/performance-log.md).
inline constexpr int kGpuPoolSpin = 200000;

// Threads of the CPU thread pool for a tool's -t: with the GPU and CPU-homed experts a runner
// thread (one of the pool's) computes the CPU's share while the thread driving the GPU keeps
// enqueueing, so that thread is counted in -t and the pool gets one fewer. One busy thread more
// than the cores stalls the pool's spinning workers for a scheduler tick per layer (tg 5.7
// instead of 75 tok/s measured on the H200 host, docs/performance-log.md).
inline int cpu_pool_threads(const GpuOptions& o, int threads) {
  const bool runner = o.n_gpu_layers > 0 && (o.cpu_moe || o.n_cpu_moe > 0) && !o.moe_cpu_sync;
  return runner && threads > 1 ? threads - 1 : threads;
}

// Headroom left free when the pool is sized automatically: prefill scratch grows with the batch.
// How the tools open a model of `model_bytes` for these options with `available` bytes of memory
// free (0: unknown). `why` says what the default chose and why (empty when a flag decided).
// Reading in leaves a fifth of the available memory to everything else; a model that does not
// fit so is mapped, as llama.cpp does by default, and pages in from disk as it is used.
inline gguf::LoadMode choose_load_mode(const GpuOptions& o, uint64_t model_bytes,
                                       uint64_t available, std::string* why) {
  if (why) why->clear();
  if (o.mmap >= 0) return o.mmap == 0 ? gguf::LoadMode::Loaded : gguf::LoadMode::Mapped;
  const bool hybrid = o.n_gpu_layers > 0 && (o.cpu_moe || o.n_cpu_moe > 0);
  if (!hybrid) return gguf::LoadMode::Mapped;
  const auto gib = [](uint64_t b) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f", static_cast<double>(b) / (1ull << 30));
    return std::string(text);
  };
  if (model_bytes == 0 || available == 0 || model_bytes > available / 5 * 4) {
    if (why) {
      *why = "model mapped, not read in: " +
             (model_bytes == 0 || available == 0
                  ? std::string("its size or the available memory is unknown")
                  : gib(model_bytes) + " GiB is more than 80% of the " + gib(available) +
                        " GiB available") +
             " (--no-mmap reads it in: faster streamed prefill and decode misses)";
    }
    return gguf::LoadMode::Mapped;
  }
  if (why) {
    *why = "model read into memory (" + gib(model_bytes) + " of " + gib(available) +
           " GiB available) for the GPU to stream its CPU-homed experts; --mmap maps it instead";
  }
  return gguf::LoadMode::Loaded;
}

// Opens the model at `path` as choose_load_mode() says for this machine; says the default's
// choice on stderr, prefixed with `tool`.
inline gguf::GgufFile open_model(const GpuOptions& o, const std::string& path, const char* tool) {
  std::string why;
  const gguf::LoadMode mode =
      choose_load_mode(o, gguf::GgufFile::file_bytes(path), available_memory_bytes(), &why);
  if (!why.empty()) std::fprintf(stderr, "%s: %s\n", tool, why.c_str());
  return gguf::GgufFile::open(path, mode);
}

inline constexpr int64_t kAutoPoolReserveMib = 512;

}  // namespace moe::gpu
