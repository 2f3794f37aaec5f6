// The routed experts of every MoE layer of a GPU forward: experts with a VRAM copy (GPU-homed
// layer or pool slot) run on the GPU while the CPU executor computes the others, both at once
// (the GPU kernels are enqueued before the CPU computes its share). Routing is decided on the host
// from the router logits, with the same code (and test hooks) as the CPU path, except on a fully
// resident layer without hooks, which routes on the device with no host round trip (decode: one
// group per item; larger batches: grouped by expert on the device), and in decode of a split
// layer (the routing handed to the CPU share through page-locked memory).
// Shared by every architecture's GPU forward: it sees only x, the router logits and the output.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "coordinator/gpu/cpu_share_runner.h"
#include "coordinator/gpu/cuda_handles.h"
#include "coordinator/gpu/expert_residency.h"
#include "coordinator/gpu/gpu_options.h"
#include "coordinator/gpu/host_model_pin.h"
#include "coordinator/gpu/pinned_buffer.h"
#include "coordinator/gpu/vram_budget.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/residency/machine_calibration.h"
#include "coordinator/residency/miss_split_profiler.h"
#include "experts/gpu/gpu_executor.h"
#include "kernels/cuda/device_matrix.h"

namespace moe::gpu {

class RoutedExpertsGpu {
 public:
  // Expert homes from `opt` (-cmoe, -ncmoe); the pool is --moe-resident-mib, or in auto mode what
  // the budget leaves after the GPU-homed experts, `other_bytes` (the caller's sequence state)
  // and a reserve. `cpu_experts` null = an in-process CPU executor on `pool`.
  // The expert kernels run on `exec` (the coordinator's stream or a moe-gpu-worker).
  RoutedExpertsGpu(VramBudget& budget, GpuExecutor& exec, const gguf::GgufFile& file,
                   const model::ModelConfig& cfg, cpu::ThreadPool& pool,
                   std::unique_ptr<model::ExpertExecutor> cpu_experts, const GpuOptions& opt,
                   uint64_t other_bytes);

  // Saves the routing profile (--moe-profile); an error is reported on stderr, not thrown.
  ~RoutedExpertsGpu();
  RoutedExpertsGpu(const RoutedExpertsGpu&) = delete;
  RoutedExpertsGpu& operator=(const RoutedExpertsGpu&) = delete;

  // Scratch for batches of up to n tokens (grow-only).
  void reserve(int64_t n_tokens);

  // out += the routed experts of `layer` for xn [n, n_embd], routed by `router` (n_expert rows of
  // n_embd; its logits [n, n_expert] go to router_logits), all on the device; enqueued on
  // `stream`. The CPU's share may still be computing when this returns (the stream waits for
  // it); the next run() or finish() waits for it on the host. Row i is the token at position
  // pos0 + i (for the hooks).
  // With `norm_after`, a one-token layer routed on the device also computes the next norm of out
  // (the next layer's attention norm) in its combine's launch and returns true; false otherwise
  // (the caller norms).
  struct NormAfter {
    const float* gains;
    float* y;
    float eps;
  };
  bool run(int64_t layer, int64_t n, const float* xn, const cuda::DeviceMatrix& router,
           float* router_logits, float* out, int64_t pos0, const model::ForwardHooks* hooks,
           cudaStream_t stream, const NormAfter* norm_after = nullptr);

  // True when every layer of an n-token step routes and computes its experts on the device
  // (all have VRAM copies, no host hooks; per item or grouped by expert): the step then enqueues
  // no host round trip and can be captured in a CUDA graph.
  bool step_on_device(int64_t n, const model::ForwardHooks* hooks) const;
  // For a step replayed from a graph (run() ran at capture only): the host-side accounting
  // run() does for every device-routed layer of an n-token step.
  void count_device_step(int64_t n);

  // Waits for the last layer's CPU share and rethrows its error: call at the end of a forward,
  // and before the stream is synchronised after an error.
  void finish();
  // On a forward's error path: waits for the CPU share like finish(), dropping its error.
  void abandon() noexcept;

  // Call before enqueuing a layer's attention: for a batch that streams its CPU-homed experts
  // (prefill with the model page-locked), starts copying them now so the copies overlap it.
  void prefetch(int64_t layer, int64_t n);

  // The host routing of the last run() that routed on the host (every run when hooks observe).
  model::LayerTrace trace(int64_t layer, int64_t pos0, int64_t n, const float* l_out) const;

  // After a forward: refills the pool at 1, 8, 64, ... routed items.
  void after_forward();

  // The live policy (routed_experts_policy.cpp): read it, change it between forwards (the
  // stream idle), and where each layer's experts are now.
  model::ExpertPolicy policy() const;
  model::PolicyOutcome set_policy(const model::ExpertPolicyChange& change);
  std::vector<model::LayerSplit> layer_split() const;

  std::string summary() const;
  // What ran where since start: routed (token, expert) items on VRAM copies, copied over PCIe
  // (decode misses and prefill streams) and on the CPU, bytes copied, the profiler's choices.
  std::string stats() const;
  model::ExpertRuntimeStats runtime() const;

 private:
  bool routes_on_device(int64_t layer, int64_t n, const model::ForwardHooks* hooks) const;
  // A batch of more than kDeviceRoutingMaxTokens tokens on a fully resident layer
  // (routed_experts_device_batch.cpp): routed, grouped by expert and combined on the device.
  bool groups_on_device(int64_t layer, int64_t n, const model::ForwardHooks* hooks) const;
  void run_grouped_on_device(int64_t layer, int64_t n, const float* xn, const float* router_logits,
                             float* out, cudaStream_t stream);
  void reserve_groups(int64_t n_tokens);
  // The host-side accounting of a device-grouped layer (also for a step replayed from a graph).
  void count_grouped_layer(int64_t layer, int64_t n);
  void count_device_layer(int64_t layer, int64_t n);
  bool run_on_device(int64_t layer, int64_t n, const float* xn, float* out, cudaStream_t stream,
                     const NormAfter* norm_after);
  // A decode layer split between the GPU and the CPU, routed on the device
  // (routed_experts_device_split.cpp): the GPU routes, publishes the routing to the CPU share
  // through h_route_ and computes its hits without waiting for the host; the runner thread takes
  // the misses (take_device_routing(), on that thread) once the routing is published.
  bool splits_on_device(int64_t layer, int64_t n, const model::ForwardHooks* hooks) const;
  void run_device_split(int64_t layer, int64_t n, const float* xn, const cuda::DeviceMatrix& router,
                        float* router_logits, float* out, cudaStream_t stream);
  std::span<const model::ExpertItem> take_device_routing(int64_t layer, int64_t n);
  // --moe-direct-share: marks in the residency, per CPU-homed layer, the hottest experts without
  // a pool slot that carry direct_share_ of the layer's routing scores (by count while nothing is
  // routed yet), for the GPU to read in place from the page-locked model. After every refill.
  void choose_direct();
  // --moe-direct-share auto: 0.75 t_cpu / (t_cpu + t_pcie) per expert, from the calibration (0
  // when it has no PCIe rate): a little below the share that makes both sides finish together.
  double auto_direct_share() const;
  // The direct share in effect from direct_opt_: 0 unless decode splits on the device with the
  // model page-locked and no decode misses streamed; auto resolved; then choose_direct().
  void update_direct();
  // --moe-stream-share auto's profiler in profiler_new_'s mode, seeded from the calibration
  // (seed_profiler(), in routed_experts_calibration.cpp, once the rates are known).
  void make_profiler();
  void seed_profiler();
  // A pool of one slot per CPU-homed expert: the most a pool can usefully hold.
  uint64_t pool_most_bytes() const;
  // The checks of set_policy(): why `change` cannot apply here (kind and message), or Applied.
  model::PolicyOutcome check_policy(const model::ExpertPolicyChange& change) const;
  // Records into batch_ gate, up, SwiGLU and down of `items` items of one token row each (item i
  // reads row dr_.x_rows[i] of xn) from the expert pointers in dr_.gate/up/down, into d_y_.
  void compute_items(int64_t layer, int64_t items, const float* xn);
  // Records the experts' activation of `rows` gate/up rows into dh: SwiGLU, or gpt-oss's
  // SwiGLU-OAI with the experts' gate/up biases (row r computed by expert row_expert[r], a device
  // list); then, after the down projection, its bias (nothing without biases).
  void record_activation(int64_t layer, float* dg, float* du, float* dh, int64_t rows,
                         const int32_t* row_expert);
  void record_down_bias(int64_t layer, float* dy, int64_t rows, const int32_t* row_expert);
  // gpt-oss's router bias of a layer in VRAM, null for the other architectures; the logits of
  // `n` tokens in rlogits get it added (router_decode adds it itself).
  const float* router_bias(int64_t layer) const;
  void add_router_bias(int64_t layer, float* rlogits, int64_t n, cudaStream_t stream);
  bool softmax_weight() const { return cfg_.gating == model::ExpertGating::SoftmaxWeight; }
  // Hands batch_ to the executor after the work enqueued on `stream` so far, and empties it.
  void submit(cudaStream_t stream);
  // The machine's rates for the decode split (routed_experts_calibration.cpp): loaded from the
  // calibration cache, or measured now and saved (--recalibrate: always measured). Seeds the
  // profiler. A failure is reported on stderr and leaves the rates unmeasured.
  void calibrate(const gguf::GgufFile& f, cpu::ThreadPool& pool, bool recalibrate);
  void measure_gpu_rates(int64_t layer);
  std::string calibration_summary() const;
  // A host-routed layer (routed_experts_split.cpp): its items split between the GPU (VRAM copies,
  // copies over PCIe) and the CPU share, both enqueued, the CPU's added into out once done.
  void run_split(int64_t layer, int64_t n, const float* xn, float* out, cudaStream_t stream);
  // Assigns each routed item to the GPU (group_of_ its expert, count_ per expert) or the CPU
  // (cpu_items_) and counts them; returns the GPU's items.
  int64_t split_items(int64_t layer, int64_t n, bool stream_all);
  // A split layer's expert lists for the GPU's share, written into h_meta_ (pinned) so one copy
  // moves them: per group its matrices and first row, per row its token, per token its rows.
  struct SplitLists {
    const void** gate = nullptr;
    const void** up = nullptr;
    const void** down = nullptr;
    int32_t* offsets = nullptr;     // group g's rows: offsets[g] .. offsets[g + 1] - 1
    int32_t* x_rows = nullptr;      // the token row each row reads
    int32_t* row_expert = nullptr;  // the expert each row computes (its biases)
    int32_t* ident = nullptr;       // 0, 1, 2, ...: the down projection writes row i to row i
    int32_t* tok_off = nullptr;     // token t's entries of rows / weights start at tok_off[t]
    int32_t* rows = nullptr;
    float* weights = nullptr;
    int32_t n_resident = 0;  // groups of experts with a VRAM copy, before the streamed ones
    int32_t n_groups = 0;
    size_t bytes = 0;  // of h_meta_ used
  };
  SplitLists write_split_lists(int64_t layer, int64_t n, int64_t total);
  // Enqueues the GPU's `total` items of a split layer (and its streamed chunks) and adds them
  // into out.
  void run_gpu_share(int64_t layer, int64_t n, const float* xn, float* out, int64_t total,
                     bool stream_all, cudaStream_t stream);
  float* scratch(VramBuffer& b, size_t floats, const char* what);
  // Feeds the profiler the last decode layer's CPU job time and copy time.
  void measure_split();
  void save_profile() const;
  void join_runner();                          // joins the CPU share and counts its busy time
  void save_profile_or_warn() const noexcept;  // reports a failure on stderr
  // Decode: picks the share of this layer's distinct misses that streams over PCIe into staging
  // slots (staged_); copy_staged() enqueues their copies.
  void choose_staged(int64_t layer, int64_t n);
  void copy_staged(int64_t layer, cudaStream_t stream);
  // How many of a prefill layer's m CPU-homed experts without a VRAM copy the CPU computes while
  // the others stream (--moe-prefill-cpu-share).
  int64_t prefill_cpu_count(int64_t m) const;
  // Whether a batch of n tokens streams every CPU-homed expert it uses to the GPU. This and the
  // staging ring below are in routed_experts_streaming.cpp.
  bool streams_batch(int64_t n) const;
  unsigned char* staging_slot(int64_t k) const;
  // Where streamed_[k] of layer l is in VRAM: its chunk of the ring, laid out by matrix.
  ResidentExpert streamed_view(int64_t l, int64_t k) const;
  // Enqueues the copy of chunk c of streamed_ (chunk_ experts) on the copy stream.
  void copy_chunk(int64_t layer, int64_t c);
  // Computes the experts in streamed_ chunk by chunk, each once its copy is done: calls
  // compute(g0, g1) for the groups (numbered from first_group) of each chunk once it is in VRAM.
  void stream_groups(int64_t layer, int32_t first_group,
                     const std::function<void(int32_t, int32_t)>& compute, cudaStream_t stream);
  const ResidentExpert* gpu_copy(int64_t layer, int32_t expert) const {
    const ResidentExpert& s = staged_[static_cast<size_t>(expert)];
    if (s.gate) return &s;
    return residency_->find(layer, expert);
  }

  VramBudget& budget_;
  GpuExecutor& exec_;
  cpu::ThreadPool& pool_;  // the CPU share's, idle while a layer is routed
  KernelBatch batch_;      // expert launches recorded, not yet submitted
  const model::ModelConfig& cfg_;
  std::vector<model::ExpertLayerTensors> tensors_;
  // gpt-oss: per layer the router's bias and the experts' gate, up and down biases (every expert's,
  // whichever side computes it), f32 in VRAM; empty for the qwen architectures.
  struct LayerBiases {
    VramBuffer router, gate, up, down;
  };
  std::vector<LayerBiases> biases_;
  std::unique_ptr<ExpertResidency> residency_;
  std::unique_ptr<model::ExpertExecutor> cpu_experts_;

  int64_t reserved_ = 0;
  VramBuffer d_g_, d_u_, d_h_, d_y_, d_meta_;
  // Decode with every expert of the layer in VRAM routes on the device.
  static constexpr int64_t kDeviceRoutingMaxTokens = 4;
  // A split layer routes batches of up to this many tokens on the device (a draft's verification,
  // several sequences' decode steps), not only decode-sized ones: each host-routed layer costs a
  // stream synchronisation. The lists below are sized for the larger of the two.
  static constexpr int64_t kDeviceSplitMaxTokens = 8;
  static constexpr int64_t kDeviceListTokens = kDeviceSplitMaxTokens;
  static_assert(kDeviceListTokens >= kDeviceRoutingMaxTokens);
  struct DeviceRouting {
    VramBuffer buf;
    float* probs = nullptr;
    float* weights = nullptr;
    int32_t* ids = nullptr;
    int32_t* ident = nullptr;    // 0, 1, 2, ...: one group per item, and the down rows
    int32_t* x_rows = nullptr;   // item i reads token i / k
    int32_t* tok_off = nullptr;  // token t's items start at t * k
    const void** gate = nullptr;
    const void** up = nullptr;
    const void** down = nullptr;
    unsigned* counter = nullptr;  // cuda::router_decode's, zero between launches
    // A device-routed split layer's hits, as combine_rows lists.
    int32_t* hit_tok_off = nullptr;
    int32_t* hit_rows = nullptr;
    float* hit_weights = nullptr;
  } dr_;
  // A device-grouped batch's lists (reserve_groups()): routing, the items grouped by expert, the
  // constant identity lists and every expert's pointers.
  struct DeviceGroups {
    VramBuffer buf;
    float* probs = nullptr;
    float* weights = nullptr;   // per item, routing order
    int32_t* ids = nullptr;     // per item
    int32_t* x_rows = nullptr;  // per grouped row: its token
    int32_t* row_expert = nullptr;
    int32_t* pos = nullptr;  // per item: its grouped row
    int32_t* offsets = nullptr;
    int32_t* ident = nullptr;    // 0, 1, 2, ...
    int32_t* tok_off = nullptr;  // t * k
    int32_t* experts = nullptr;  // 0 .. n_expert - 1
    const void** gate = nullptr;
    const void** up = nullptr;
    const void** down = nullptr;
  } dg_;
  bool device_groups_ = false;  // unless --moe-host-routing
  // Device-routed split layers: on unless --moe-host-routing. The routing the GPU publishes for
  // the CPU share (page-locked: the flag word, then ids, weights and hit marks) and its sequence.
  bool device_split_ = false;
  double direct_opt_ = -1;   // --moe-direct-share as asked (< 0: auto)
  double direct_share_ = 0;  // in effect
  bool direct_auto_ = false;
  bool profiler_new_ = false;             // --moe-resident-profiler new
  const gguf::GgufFile* file_ = nullptr;  // for a recalibration
  uint64_t policy_changes_ = 0;
  double recalibrated_ms_ = 0;
  PinnedBuffer h_route_;
  uint32_t* route_flag_ = nullptr;
  int32_t* route_ids_ = nullptr;
  float* route_weights_ = nullptr;
  uint8_t* route_hit_ = nullptr;
  uint32_t route_seq_ = 0;
  // Host side: pinned staging and routing scratch.
  PinnedBuffer h_xn_, h_rlogits_, h_cpu_out_, h_meta_;
  std::vector<float> rprobs_, rweights_;
  std::vector<int32_t> rids_, forced_, group_of_, count_, next_row_;
  std::vector<model::ExpertItem> cpu_items_;
  // Misses streamed over PCIe (--moe-stream-share): staging slots in VRAM, and this layer's
  // staged copies by expert.
  int64_t staging_slots_ = 0;
  double stream_share_ = 0.0;
  std::unique_ptr<HostModelPin> pin_;  // the loaded model, page-locked for the copies
  VramBuffer staging_;
  std::vector<ResidentExpert> staged_;
  std::vector<int32_t> staged_ids_, misses_, streamed_;
  std::vector<unsigned char*> staged_dst_;  // where staged_ids_[j] is copied: pool or staging slot
  // Prefill batches of at least this many tokens stream their misses (llama.cpp offloads a
  // CPU-resident weight's product to the GPU from 32 tokens).
  static constexpr int64_t kStreamBatchMinTokens = 32;
  // Streams of the prefill chunks' copies (ring place h copies on h % size); the first also times
  // the calibration's copies. Empty when nothing streams.
  std::vector<std::unique_ptr<CudaStream>> copy_streams_;
  // The staging slots are a ring of ring_ chunks of chunk_ slots. Per chunk: its experts are in
  // VRAM / have been computed (and may be overwritten).
  int64_t chunk_ = 0, ring_ = 0;
  std::vector<std::unique_ptr<CudaEvent>> slots_ready_, slots_free_;
  int64_t prefetched_layer_ = -1;  // the layer whose streamed_ experts prefetch() started
  // Chunks are numbered across layers; chunk s uses ring place s % ring_. layer_chunk0_: this
  // layer's first.
  int64_t chunk_seq_ = 0, layer_chunk0_ = 0;
  // Prefill: the share of a layer's streamed experts the CPU computes instead (< 0: auto), which
  // of the prefetched layer's experts those are (by expert) and how many.
  double prefill_cpu_share_ = 0;
  std::vector<char> prefill_cpu_;
  std::vector<int32_t> prefill_candidates_, prefill_coldest_;  // prefetch()'s scratch
  int64_t prefill_cpu_n_ = 0;
  // Auto: moving averages of the time per expert of each side in the prefill layers run so far,
  // as that layer saw it: the CPU job over its experts, and the GPU's expert window (copies waited
  // for and kernels, device events) over the streamed experts; 0 until measured.
  double prefill_cpu_us_per_expert_ = 0, prefill_gpu_us_per_expert_ = 0;
  int64_t cpu_prefill_timed_ = 0;     // experts of the runner's last job, when a prefill layer's
  int64_t gpu_prefill_timed_ = 0;     // streamed experts of the last timed GPU window, likewise
  uint64_t prefill_cpu_experts_ = 0;  // experts computed on the CPU instead of streamed, in all
  // Decode misses copied per layer visit, from measured rates (when no fixed share is given).
  std::unique_ptr<model::MissSplitProfiler> profiler_;
  // Device events around a decode layer's copies, and how many experts they timed (0: none).
  std::unique_ptr<CudaEvent> pcie_t0_, pcie_t1_;
  int64_t pcie_timed_ = 0;
  bool cpu_timed_ = false;  // the runner's last job was a decode layer's, not yet measured
  // Busy time: the runner's jobs, and device events around a split layer's GPU expert kernels
  // (read once the stream has passed them, at the next host-routed layer).
  double cpu_busy_us_ = 0, gpu_busy_us_ = 0;
  std::unique_ptr<CudaEvent> gpu_t0_, gpu_t1_;
  bool gpu_timed_ = false;
  // Device events where the stream reaches a host-routed layer's round trip (the router logits
  // copied back, the host routing), alternating between layers: with the next gpu_t0_ they time
  // how long the GPU waited for the host's expert lists.
  std::unique_ptr<CudaEvent> route_t0_[2];
  int route_cur_ = 0;
  double route_wait_us_ = 0;
  double route_host_us_ = 0;       // the host's part of it: routing and the expert lists
  model::MachineCalibration cal_;  // the machine's measured rates (calibrate())
  bool cal_cached_ = false;        // cal_ came from the cache file, not measured this start
  int cal_threads_ = 0;            // the CPU pool's threads the split uses
  struct Counters {
    uint64_t resident = 0, streamed = 0, cpu = 0, pcie_bytes = 0, admitted = 0;
    uint64_t decode = 0, decode_resident = 0;  // items of decode visits, and those on VRAM copies
    uint64_t direct = 0;  // of streamed: read in place by the GPU's kernels (--moe-direct-share)
  } stats_;
  std::string profile_path_;   // --moe-profile
  int64_t profile_warm_ = -1;  // experts copied at start from a loaded profile (-1: none loaded)
  uint64_t refill_at_ = 1;     // routed-item counts at which the pool is refilled
  // Last: it runs jobs that read the buffers above, and stops first.
  std::unique_ptr<CpuShareRunner> runner_;
};

}  // namespace moe::gpu
