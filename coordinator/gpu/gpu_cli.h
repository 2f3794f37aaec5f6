// The GPU flags, declared once for every tool (moe-run, moe-bench, moe-coordinator).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "coordinator/gpu/gpu_options.h"
#include "coordinator/residency/expert_policy.h"

namespace moe::gpu {

// A share in [0, 1], or "auto" as -1.
inline double share_or_auto(const std::string& flag, const std::string& v) {
  if (const std::optional<double> s = model::parse_share(v)) return *s;
  throw CLI::ValidationError(flag, "'" + v + "' is neither auto nor a number in [0, 1]");
}

// `mmap_flag`: also --mmap (moe-bench has its own, llama-bench's --mmap 0|1).
inline void add_gpu_options(CLI::App& app, GpuOptions& o, bool mmap_flag = true) {
  app.add_option("--n-gpu-layers", o.n_gpu_layers,
                 "-ngl N: layers on the GPU (0: CPU only; >= the layer count: attention, norms, "
                 "router, output head and KV cache in VRAM, e.g. -ngl 99)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--main-gpu", o.device, "CUDA device index (default 0)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--vram-budget-mib", o.vram_budget_mib,
                 "cap on everything allocated on the GPU, in MiB (default: free VRAM at start)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--cpu-moe", o.cpu_moe, "-cmoe: home every layer's routed experts on the CPU");
  app.add_option("--n-cpu-moe", o.n_cpu_moe,
                 "-ncmoe N: home the routed experts of the first N layers on the CPU")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--moe-resident-mib", o.moe_resident_mib,
                 "VRAM pool (MiB) of whole experts copied from the CPU-homed ones, computed on "
                 "the GPU when routed (default: auto, what the budget leaves minus a reserve; 0: "
                 "off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option_function<std::string>(
      "--moe-stream-share",
      [&o](const std::string& v) { o.moe_stream_share = share_or_auto("--moe-stream-share", v); },
      "share (0-1) of each decode layer's CPU-homed misses copied over PCIe and computed on "
      "the GPU while the CPU computes the rest, or auto: chosen from the CPU and PCIe rates "
      "measured as it runs (needs --no-mmap / -mmp 0; default 0: none; a fixed 0.25-0.35 "
      "measured best on a PCIe 5 host)");
  app.add_option_function<std::string>(
      "--moe-direct-share",
      [&o](const std::string& v) { o.moe_direct_share = share_or_auto("--moe-direct-share", v); },
      "share (0-1) of each decode layer's expected CPU-homed misses that the GPU reads in "
      "place from the page-locked model over PCIe (its hottest experts without a VRAM copy) "
      "while the CPU computes the rest, or auto (default): balanced from the calibrated CPU "
      "and PCIe time per expert when the model is read in; 0: none");
  app.add_option_function<std::string>(
      "--moe-prefill-cpu-share",
      [&o](const std::string& v) {
        o.moe_prefill_cpu_share = share_or_auto("--moe-prefill-cpu-share", v);
      },
      "with --no-mmap / -mmp 0: share (0-1) of each prefill layer's streamed CPU-homed experts "
      "that the CPU computes instead while the rest cross PCIe, or auto: balanced from both "
      "sides' time per expert measured on the previous layers (default 0.2, measured best on a "
      "PCIe 5 host; 0: all stream)");
  app.add_option_function<std::string>(
         "--moe-resident-profiler", [&o](const std::string& v) { o.moe_profiler_new = v == "new"; },
         "with --moe-stream-share auto: old (default) copies at least one decode miss per layer "
         "visit, new none when the measured rates say the CPU alone is faster")
      ->check(CLI::IsMember({"old", "new"}));
  app.add_option_function<std::string>(
         "--moe-resident-grouping",
         [&o](const std::string& v) { o.moe_grouping_layout = v == "layout"; },
         "off (default): one VRAM pool across all layers, a miss admitted over PCIe evicts the "
         "coldest expert anywhere; layout: each layer owns a contiguous range of slots sized by "
         "its share of the routing, and evicts only its own experts")
      ->check(CLI::IsMember({"off", "layout"}));
  app.add_option("--moe-staging-slots", o.moe_staging_slots,
                 "VRAM slots (one expert each) that streamed experts are copied into (default 128)")
      ->check(CLI::Range(int64_t{2}, int64_t{4096}));
  app.add_option("--moe-staging-chunk", o.moe_staging_chunk,
                 "experts per chunk of a prefill's stream through the staging slots: a ring of "
                 "chunks, each copied while earlier ones are computed (default 16; 0: half the "
                 "slots)")
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  app.add_option("--moe-copy-streams", o.moe_copy_streams,
                 "CUDA streams a prefill's chunks of streamed experts are copied on, in turn, so "
                 "that one copy's fixed cost overlaps another's transfer (default 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{4}));
  app.add_flag("--moe-cpu-sync", o.moe_cpu_sync,
               "compute the CPU's expert share on the thread that drives the GPU and "
               "synchronise with it every layer (default: a runner thread computes it while the "
               "next work is enqueued, and the GPU waits on a flag in pinned memory)");
  app.add_flag("--moe-host-routing", o.moe_host_routing,
               "route decode layers split between GPU and CPU, and batches of more than 4 "
               "tokens, on the host, with a stream synchronisation per layer (default: on the "
               "GPU, which hands a split layer's routing to the CPU share through pinned memory "
               "and groups a batch's tokens by expert itself)");
  app.add_option("--moe-profile", o.moe_profile,
                 "routing profile file: loaded at start so the VRAM pool begins with the experts "
                 "earlier runs routed most (a missing file starts a new one), saved as it grows "
                 "and at exit");
  app.add_flag("--recalibrate", o.recalibrate,
               "measure PCIe bandwidth and the GPU's and CPU's time per expert again at start "
               "(default: the cached figures for this machine and model, in "
               "$MOE_CACHE_DIR or ~/.cache/moe-runtime/calibration.json, measured once)");
  app.add_flag("--no-cuda-graphs{false}", o.cuda_graphs,
               "launch a decode step's kernels one by one (default: a step whose experts are all "
               "in VRAM replays a CUDA graph)");
  app.add_option(
         "--gpu-executor", o.gpu_executor,
         "where the routed experts' GPU kernels run: in-process (default: the coordinator's "
         "own CUDA context, measured faster) or process (a moe-gpu-worker with the same "
         "VRAM mapped, under the MPS daemon scripts/with-mps starts; without MPS it falls "
         "back to in-process and says why)")
      ->check(CLI::IsMember({"in-process", "process"}));
  app.add_flag_function(
      "--no-mmap", [&o](int64_t) { o.mmap = 0; },
      "read the model into memory instead of mapping it; with -ngl and CPU-homed experts it is "
      "page-locked, prefill batches of 32+ tokens then stream those experts to the GPU over "
      "PCIe and decode reads a share of its misses in place (default with -cmoe/-ncmoe when the "
      "model fits in 80% of the available memory)");
  if (mmap_flag) {
    app.add_flag_function(
        "--mmap", [&o](int64_t) { o.mmap = 1; },
        "map the model file instead of reading it in (the default without CPU-homed experts)");
  }
}

}  // namespace moe::gpu
