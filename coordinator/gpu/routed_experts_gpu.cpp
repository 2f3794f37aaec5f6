#include "coordinator/gpu/routed_experts_gpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "common/error.h"
#include "coordinator/gpu/gpu_upload.h"
#include "coordinator/model/batch_routing.h"
#include "coordinator/residency/routing_profile.h"
#include "experts/cpu_expert_executor.h"
#include "experts/tensor_table.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/expert_lists.h"
#include "kernels/cuda/expert_matmul.h"
#include "kernels/cuda/host_read.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router.h"

namespace moe::gpu {
namespace {

// Packs the per-layer expert lists into one pinned block so a single copy moves them.
class MetaWriter {
 public:
  explicit MetaWriter(unsigned char* base) : base_(base) {}
  template <typename T>
  T* take(int64_t n) {
    off_ = (off_ + 15) & ~size_t{15};
    T* p = reinterpret_cast<T*>(base_ + off_);
    off_ += static_cast<size_t>(n) * sizeof(T);
    return p;
  }
  size_t size() const { return off_; }

 private:
  unsigned char* base_;
  size_t off_ = 0;
};

// Bytes of one expert's gate, up and down matrices: what one copy over PCIe moves.
uint64_t expert_bytes(const model::ExpertLayerTensors& t) {
  return t.gate.expert_bytes() + t.up.expert_bytes() + t.down.expert_bytes();
}

// A moving average over the last few layers: they differ little, but a busy machine can slow one.
void average(double& avg, double sample) { avg = avg > 0 ? 0.75 * avg + 0.25 * sample : sample; }

template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  return v.data();
}

}  // namespace

RoutedExpertsGpu::RoutedExpertsGpu(VramBudget& budget, GpuExecutor& exec, const gguf::GgufFile& f,
                                   const model::ModelConfig& cfg, cpu::ThreadPool& pool,
                                   std::unique_ptr<model::ExpertExecutor> cpu_experts,
                                   const GpuOptions& opt, uint64_t other_bytes)
    : budget_(budget), exec_(exec), pool_(pool), cfg_(cfg) {
  const int64_t E = cfg.n_embd, X = cfg.n_expert, F = cfg.n_ff_exp;
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    tensors_.push_back(model::require_expert_tensors(f, l, E, F, X));
  }
  // Expert homes: -cmoe all on the CPU, -ncmoe N the first N layers, else all in VRAM.
  std::vector<bool> gpu_home(static_cast<size_t>(cfg.n_layer));
  uint64_t gpu_expert_bytes = 0;
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    const bool on_gpu = !opt.cpu_moe && l >= opt.n_cpu_moe;
    gpu_home[static_cast<size_t>(l)] = on_gpu;
    if (on_gpu) {
      const auto& t = tensors_[static_cast<size_t>(l)];
      gpu_expert_bytes += t.bytes();
    }
  }
  // Streaming: decode misses (--moe-stream-share) and prefill batches, from the loaded model.
  const bool cpu_homed = std::find(gpu_home.begin(), gpu_home.end(), false) != gpu_home.end();
  const bool streaming = (opt.moe_stream_share != 0 || f.loaded()) && cpu_homed;
  uint64_t staging_bytes = 0;
  if (streaming) {
    if (opt.moe_staging_slots < 2 || opt.moe_staging_slots % 2 != 0) {
      throw Error("staging slots: " + std::to_string(opt.moe_staging_slots) +
                  " (a positive even number: at least two chunks are in flight)");
    }
    staging_slots_ = opt.moe_staging_slots;
    chunk_ = opt.moe_staging_chunk > 0 ? opt.moe_staging_chunk : staging_slots_ / 2;
    const bool divides = staging_slots_ % chunk_ == 0 && staging_slots_ / chunk_ >= 2;
    if (!divides && opt.moe_staging_chunk == GpuOptions{}.moe_staging_chunk) {
      chunk_ = staging_slots_ / 2;  // --moe-staging-slots alone, not a multiple of the default
    } else if (!divides) {
      throw Error("staging chunk: " + std::to_string(chunk_) + " experts does not divide the " +
                  std::to_string(staging_slots_) + " staging slots into two or more chunks");
    }
    ring_ = staging_slots_ / chunk_;
    staging_bytes =
        static_cast<uint64_t>(staging_slots_) * ExpertResidency::slot_bytes_for(tensors_, gpu_home);
  }
  uint64_t pool_bytes = 0;
  if (opt.moe_resident_mib > 0) {
    pool_bytes = static_cast<uint64_t>(opt.moe_resident_mib) << 20;
  } else if (opt.moe_resident_mib < 0) {
    const uint64_t need =
        gpu_expert_bytes + other_bytes + staging_bytes + (uint64_t{kAutoPoolReserveMib} << 20);
    pool_bytes = budget.available() > need ? budget.available() - need : 0;
  }
  residency_ = std::make_unique<ExpertResidency>(
      budget, tensors_, gpu_home, X, pool_bytes,
      opt.moe_grouping_layout ? model::Grouping::Layout : model::Grouping::Off);
  profile_path_ = opt.moe_profile;
  if (!profile_path_.empty()) {
    if (const auto p = model::RoutingProfile::load(profile_path_)) {
      p->check_matches(cfg.arch, cfg.n_layer, X, profile_path_);
      residency_->set_counts(p->counts);
      profile_warm_ = residency_->refill();
    }
    save_profile();  // an unwritable path is an error now, not after the first tokens
  }
  staged_.assign(static_cast<size_t>(X), ResidentExpert{});
  prefill_cpu_.assign(static_cast<size_t>(X), 0);
  if (streaming) {
    stream_share_ = opt.moe_stream_share;
    prefill_cpu_share_ = opt.moe_prefill_cpu_share;
    pin_ = std::make_unique<HostModelPin>(f);
    if (stream_share_ < 0 && pin_->pinned()) {
      // Decode: up to kDeviceRoutingMaxTokens tokens' misses, at most a slot each.
      const int max_m = static_cast<int>(kDeviceRoutingMaxTokens * cfg.n_expert_used);
      profiler_ = std::make_unique<model::MissSplitProfiler>(
          opt.moe_profiler_new ? model::MissSplitProfiler::Mode::New
                               : model::MissSplitProfiler::Mode::Old,
          static_cast<int>(std::min<int64_t>(max_m, staging_slots_)));
      pcie_t0_ = std::make_unique<CudaEvent>(/*timing=*/true);
      pcie_t1_ = std::make_unique<CudaEvent>(/*timing=*/true);
    }
    staging_ = budget.allocate(staging_bytes, VramUse::Pool, "PCIe staging slots");
    if (opt.moe_copy_streams < 1 || opt.moe_copy_streams > 4) {
      throw Error("copy streams: " + std::to_string(opt.moe_copy_streams) + " (1 to 4)");
    }
    for (int64_t i = 0; i < opt.moe_copy_streams; ++i) {
      copy_streams_.push_back(std::make_unique<CudaStream>());
    }
    for (int64_t i = 0; i < ring_; ++i) {
      slots_ready_.push_back(std::make_unique<CudaEvent>());
      slots_free_.push_back(std::make_unique<CudaEvent>());
    }
  }
  gpu_t0_ = std::make_unique<CudaEvent>(/*timing=*/true);
  gpu_t1_ = std::make_unique<CudaEvent>(/*timing=*/true);
  for (auto& e : route_t0_) e = std::make_unique<CudaEvent>(/*timing=*/true);
  cpu_experts_ = cpu_experts ? std::move(cpu_experts) : model::cpu_experts_for(f, pool);
  runner_ =
      std::make_unique<CpuShareRunner>(*cpu_experts_, cpu_homed && !opt.moe_cpu_sync, kGpuPoolSpin);

  // Device routing buffers and the constant index lists of the one-group-per-item layout.
  const int64_t items = kDeviceRoutingMaxTokens * cfg.n_expert_used;
  const size_t bytes = static_cast<size_t>(kDeviceRoutingMaxTokens * X + 2 * items) * 4 +
                       static_cast<size_t>(3 * items) * sizeof(void*) +
                       static_cast<size_t>(3 * items + kDeviceRoutingMaxTokens + 3) * 4 + 256;
  dr_.buf = budget.allocate(bytes, VramUse::Scratch, "device routing");
  MetaWriter w(dr_.buf.as<unsigned char>());  // only offsets are computed here
  dr_.gate = w.take<const void*>(items);
  dr_.up = w.take<const void*>(items);
  dr_.down = w.take<const void*>(items);
  dr_.probs = w.take<float>(kDeviceRoutingMaxTokens * X);
  dr_.weights = w.take<float>(items);
  dr_.ids = w.take<int32_t>(items);
  dr_.ident = w.take<int32_t>(items + 1);
  dr_.x_rows = w.take<int32_t>(items);
  dr_.tok_off = w.take<int32_t>(kDeviceRoutingMaxTokens + 1);
  dr_.counter = w.take<unsigned>(1);
  MOE_CUDA_CHECK(cudaMemset(dr_.counter, 0, sizeof(unsigned)));
  std::vector<int32_t> ident(static_cast<size_t>(items + 1)), x_rows(static_cast<size_t>(items)),
      tok_off(static_cast<size_t>(kDeviceRoutingMaxTokens + 1));
  for (int64_t i = 0; i <= items; ++i) ident[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < items; ++i) {
    x_rows[static_cast<size_t>(i)] = static_cast<int32_t>(i / cfg.n_expert_used);
  }
  for (int64_t t = 0; t <= kDeviceRoutingMaxTokens; ++t) {
    tok_off[static_cast<size_t>(t)] = static_cast<int32_t>(t * cfg.n_expert_used);
  }
  MOE_CUDA_CHECK(cudaMemcpy(dr_.ident, ident.data(), ident.size() * 4, cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(cudaMemcpy(dr_.x_rows, x_rows.data(), x_rows.size() * 4, cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(
      cudaMemcpy(dr_.tok_off, tok_off.data(), tok_off.size() * 4, cudaMemcpyHostToDevice));
  if (cpu_homed) calibrate(f, pool, opt.recalibrate);
}

float* RoutedExpertsGpu::scratch(VramBuffer& b, size_t floats, const char* what) {
  return grow_scratch(budget_, b, floats, what);
}

void RoutedExpertsGpu::reserve(int64_t n) {
  if (n <= reserved_) return;
  const auto E = static_cast<size_t>(cfg_.n_embd);
  const auto N = static_cast<size_t>(n);
  const auto K = static_cast<size_t>(cfg_.n_expert_used);
  const auto F = static_cast<size_t>(cfg_.n_ff_exp);
  const auto X = static_cast<size_t>(cfg_.n_expert);
  scratch(d_g_, N * K * F, "scratch gate");
  scratch(d_u_, N * K * F, "scratch up");
  scratch(d_h_, N * K * F, "scratch swiglu");
  scratch(d_y_, N * K * E, "scratch expert out");
  // Expert lists: 3 pointers per group, 6 ints per item, 2 offset arrays, alignment slack.
  const size_t meta = 3 * sizeof(void*) * X + (6 * N * K + N + X + 2) * 4 + 256;
  scratch(d_meta_, meta / sizeof(float) + 1, "scratch expert lists");
  h_xn_.reserve(N * E * sizeof(float));
  h_cpu_out_.reserve(N * E * sizeof(float));
  h_rlogits_.reserve(N * X * sizeof(float));
  h_meta_.reserve(meta);
  grow(rprobs_, n * cfg_.n_expert);
  grow(rweights_, n * cfg_.n_expert_used);
  grow(rids_, n * cfg_.n_expert_used);
  grow(forced_, cfg_.n_expert_used);
  reserved_ = n;
}

bool RoutedExpertsGpu::run(int64_t l, int64_t n, const float* xn, const cuda::DeviceMatrix& router,
                           float* rlogits, float* out, int64_t pos0,
                           const model::ForwardHooks* hooks, cudaStream_t stream,
                           const NormAfter* norm_after) {
  if (n > reserved_) throw Error("RoutedExpertsGpu: batch larger than reserved");
  const bool on_device = routes_on_device(l, n, hooks);
  // One decoding token routed on the device: logits, top-k and expert pointers in one launch.
  const bool fused_router = on_device && n == 1 && cuda::router_decode_supported(router.type);
  // Enqueued before the host may wait below, so the GPU need not idle for it.
  if (!fused_router) cuda::matmul(router, xn, n, rlogits, stream);
  // The previous layer's CPU share: its buffers are reused below, and its error surfaces here.
  join_runner();
  if (on_device) {
    if (fused_router) {
      cuda::router_decode(router, xn, cfg_.n_expert_used,
                          {rlogits, dr_.probs, dr_.ids, dr_.weights, residency_->device_table(l),
                           dr_.gate, dr_.up, dr_.down, dr_.counter},
                          stream);
    } else {
      cuda::router_topk(rlogits, n, cfg_.n_expert, cfg_.n_expert_used, dr_.probs, dr_.ids,
                        dr_.weights, stream);
      cuda::gather_expert_pointers(dr_.ids, n * cfg_.n_expert_used, residency_->device_table(l),
                                   cfg_.n_expert, dr_.gate, dr_.up, dr_.down, stream);
    }
    const bool normed = run_on_device(l, n, xn, out, stream, norm_after);
    count_device_layer(l, n);
    return normed;
  }
  if (l == 0) residency_->tick(n);  // a forward's tokens: the clock routing scores decay with
  const int64_t E = cfg_.n_embd, X = cfg_.n_expert, K = cfg_.n_expert_used;
  float* hl = h_rlogits_.get<float>();
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(hl, rlogits, static_cast<size_t>(n * X) * 4, cudaMemcpyDeviceToHost, stream));
  if (!residency_->layer_on_gpu(l)) {
    MOE_CUDA_CHECK(cudaMemcpyAsync(h_xn_.get(), xn, static_cast<size_t>(n * E) * 4,
                                   cudaMemcpyDeviceToHost, stream));
  }
  route_cur_ ^= 1;
  MOE_CUDA_CHECK(cudaEventRecord(route_t0_[route_cur_]->get(), stream));
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (profiler_) measure_split();
  if (gpu_timed_) {
    // The last split layer's: its expert window, and its host round trip (recorded by the run()
    // before this one).
    float ms = 0, wait_ms = 0;
    if (cudaEventElapsedTime(&ms, gpu_t0_->get(), gpu_t1_->get()) == cudaSuccess &&
        cudaEventElapsedTime(&wait_ms, route_t0_[route_cur_ ^ 1]->get(), gpu_t0_->get()) ==
            cudaSuccess) {
      const double us = static_cast<double>(ms) * 1000.0;
      gpu_busy_us_ += us;
      route_wait_us_ += static_cast<double>(wait_ms) * 1000.0;
      if (gpu_prefill_timed_ > 0) {
        average(prefill_gpu_us_per_expert_, us / static_cast<double>(gpu_prefill_timed_));
      }
    } else {
      (void)cudaGetLastError();  // an error path: not counted
    }
    gpu_timed_ = false;
    gpu_prefill_timed_ = 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  model::route_batch(hl, n, X, K, l, pos0, hooks, forced_.data(), rprobs_.data(), rids_.data(),
                     rweights_.data(), &pool_);
  run_split(l, n, xn, out, stream);
  route_host_us_ +=
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  return false;
}

void RoutedExpertsGpu::count_device_layer(int64_t l, int64_t n) {
  if (l == 0) residency_->tick(n);
  stats_.resident += static_cast<uint64_t>(n * cfg_.n_expert_used);
  stats_.decode += static_cast<uint64_t>(n * cfg_.n_expert_used);
  stats_.decode_resident += static_cast<uint64_t>(n * cfg_.n_expert_used);
  cpu_experts_->note_split(l, n, n * cfg_.n_expert_used, 0);
}

bool RoutedExpertsGpu::step_on_device(int64_t n, const model::ForwardHooks* hooks) const {
  if (exec_.remote()) return false;  // a worker's launches cannot join this process's graph
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    if (!routes_on_device(l, n, hooks)) return false;
  }
  return true;
}

void RoutedExpertsGpu::count_device_step(int64_t n) {
  for (int64_t l = 0; l < cfg_.n_layer; ++l) count_device_layer(l, n);
}

bool RoutedExpertsGpu::routes_on_device(int64_t l, int64_t n,
                                        const model::ForwardHooks* hooks) const {
  // Hooks need the host's routing; prefill wants the host's grouping by expert (each expert's
  // weights read once for all its tokens), which one group per item would not give.
  const bool host_hooks = hooks && (hooks->force_experts || hooks->observe_layer);
  return residency_->layer_on_gpu(l) && n <= kDeviceRoutingMaxTokens && !host_hooks;
}

bool RoutedExpertsGpu::run_on_device(int64_t l, int64_t n, const float* xn, float* out,
                                     cudaStream_t stream, const NormAfter* norm_after) {
  const int64_t E = cfg_.n_embd, K = cfg_.n_expert_used;
  compute_items(l, n * K, xn);
  const bool normed = norm_after && n == 1 && cuda::combine_rmsnorm_supported(E);
  if (normed) {
    batch_.combine_rmsnorm(d_y_.as<float>(), dr_.weights, K, out, norm_after->gains, norm_after->y,
                           E, norm_after->eps);
  } else {
    batch_.combine_rows(d_y_.as<float>(), dr_.tok_off, dr_.ident, dr_.weights, n, E,
                        /*accumulate=*/true, out);
  }
  submit(stream);
  return normed;
}

void RoutedExpertsGpu::submit(cudaStream_t stream) {
  try {
    exec_.submit(batch_, stream);
  } catch (...) {
    batch_.clear();  // not to be run by the next layer's submit
    throw;
  }
  batch_.clear();
}

void RoutedExpertsGpu::compute_items(int64_t l, int64_t items, const float* xn) {
  const int64_t E = cfg_.n_embd, F = cfg_.n_ff_exp;
  const model::ExpertLayerTensors& et = tensors_[static_cast<size_t>(l)];
  const auto ig = static_cast<int32_t>(items);
  float* dg = d_g_.as<float>();
  float* du = d_u_.as<float>();
  float* dh = d_h_.as<float>();
  if (cuda::fused_gate_up_supported(et.gate.type(), et.up.type(), E) &&
      et.gate.row_bytes == et.up.row_bytes) {
    batch_.grouped_gate_up_swiglu(et.gate.type(), E, F, et.gate.row_bytes, dr_.gate, dr_.up,
                                  dr_.ident, ig, dr_.x_rows, xn, E, dh);
  } else {
    batch_.grouped_matmul(et.gate.type(), E, F, et.gate.row_bytes, dr_.gate, dr_.ident, ig,
                          dr_.x_rows, items, 1, xn, E, dg);
    batch_.grouped_matmul(et.up.type(), E, F, et.up.row_bytes, dr_.up, dr_.ident, ig, dr_.x_rows,
                          items, 1, xn, E, du);
    batch_.swiglu(dg, du, dh, items * F);
  }
  batch_.grouped_matmul(et.down.type(), F, E, et.down.row_bytes, dr_.down, dr_.ident, ig, dr_.ident,
                        items, 1, dh, F, d_y_.as<float>());
}

std::string RoutedExpertsGpu::summary() const {
  std::string s = residency_->summary() + "; " + exec_.describe();
  if (!copy_streams_.empty() && pin_->pinned()) {
    s += "; prefill batches of " + std::to_string(kStreamBatchMinTokens) +
         "+ tokens stream their CPU-homed experts over PCIe (" + std::to_string(staging_slots_) +
         " staging slots in chunks of " + std::to_string(chunk_) + ", " +
         std::to_string(copy_streams_.size()) + " copy stream" +
         (copy_streams_.size() > 1 ? "s)" : ")");
    if (prefill_cpu_share_ < 0) {
      s += ", the CPU computing a share balanced from the measured rates";
    } else if (prefill_cpu_share_ > 0) {
      char b[64];
      std::snprintf(b, sizeof b, ", the CPU computing %.2f of them", prefill_cpu_share_);
      s += b;
    }
  }
  if (!profile_path_.empty()) {
    s += "; routing profile " + profile_path_ +
         (profile_warm_ >= 0 ? " loaded (" + std::to_string(profile_warm_) +
                                   " experts copied into the pool at start)"
                             : " (new)");
  }
  if (residency_->has_cpu_experts()) {
    s += runner_->async()
             ? "; the CPU's share runs on a runner thread the GPU waits on"
             : "; the CPU's share runs on the GPU's host thread" +
                   (runner_->refusal().empty() ? std::string() : " (" + runner_->refusal() + ")");
  }
  if (!cal_.key.empty()) s += "; " + calibration_summary();
  if (profiler_) {
    s += "; decode misses copied over PCIe: " + profiler_->summary();
  }
  if (stream_share_ > 0) {
    char share[16];
    std::snprintf(share, sizeof share, "%.2f", stream_share_);
    s += std::string("; ") + share + " of each decode layer's misses streamed over PCIe" +
         (pin_->pinned() ? "" : " (from pageable memory: " + pin_->refusal() + ")");
  }
  return s;
}

void RoutedExpertsGpu::choose_staged(int64_t l, int64_t n) {
  for (int32_t e : staged_ids_) staged_[static_cast<size_t>(e)] = ResidentExpert{};
  staged_ids_.clear();
  staged_dst_.clear();
  // Decode only: a prefill batch streams all its misses (streams_batch).
  if ((stream_share_ <= 0 && !profiler_) || n > kDeviceRoutingMaxTokens) return;
  std::vector<int32_t>& misses = misses_;  // distinct missing experts, in routing order
  misses.clear();
  for (int64_t i = 0; i < n * cfg_.n_expert_used; ++i) {
    const int32_t e = rids_[static_cast<size_t>(i)];
    residency_->pin(l, e);  // no admission below may evict an expert this visit computes from
    if (!residency_->find(l, e) && std::find(misses.begin(), misses.end(), e) == misses.end()) {
      misses.push_back(e);
    }
  }
  const auto m = static_cast<int64_t>(misses.size());
  int64_t want = 0;
  if (profiler_) {
    want = profiler_->choose(static_cast<int>(m));
  } else {
    want = std::llround(static_cast<double>(m) * stream_share_);
  }
  want = std::min<int64_t>(want, staging_slots_);
  // A copied miss goes into the pool when it is hotter than the expert it would displace (it is
  // then a hit next time), else into a staging slot for this visit only.
  int64_t staging = 0;
  for (int64_t j = 0; j < want; ++j) {
    const int32_t e = misses[static_cast<size_t>(j)];
    unsigned char* dst = residency_->admit(l, e);
    if (dst) {
      ++stats_.admitted;
    } else {
      dst = staging_slot(staging++);
    }
    staged_[static_cast<size_t>(e)] = residency_->slot_view(l, dst);
    staged_ids_.push_back(e);
    staged_dst_.push_back(dst);
  }
  residency_->unpin_all();
}

void RoutedExpertsGpu::copy_staged(int64_t l, cudaStream_t stream) {
  if (staged_ids_.empty()) return;
  // A prefill's copies into the slots (on the copy stream) are done before these start.
  for (const auto& e : slots_ready_) MOE_CUDA_CHECK(cudaStreamWaitEvent(stream, e->get(), 0));
  if (profiler_) MOE_CUDA_CHECK(cudaEventRecord(pcie_t0_->get(), stream));
  for (size_t j = 0; j < staged_ids_.size(); ++j) {
    residency_->stage(l, staged_ids_[j], staged_dst_[j], stream);
    stats_.pcie_bytes += expert_bytes(tensors_[static_cast<size_t>(l)]);
  }
  if (profiler_) {
    MOE_CUDA_CHECK(cudaEventRecord(pcie_t1_->get(), stream));
    pcie_timed_ = static_cast<int64_t>(staged_ids_.size());
  }
}

void RoutedExpertsGpu::run_split(int64_t l, int64_t n, const float* xn, float* out,
                                 cudaStream_t stream) {
  const int64_t E = cfg_.n_embd, X = cfg_.n_expert, K = cfg_.n_expert_used, F = cfg_.n_ff_exp;
  // A batch counts as much as one token toward the residency scores: the pool serves decode,
  // whose experts follow the last tokens (measured: a pool planned from pp512's routing and
  // scored with it at full weight held tg128 at 70 tok/s against 81-87 planned from decode).
  const double weight = 1.0 / static_cast<double>(n);
  for (int64_t i = 0; i < n * K; ++i) {
    residency_->record(l, rids_[static_cast<size_t>(i)], weight);
  }
  // The misses streamed over PCIe this step (decode) run on the GPU like resident experts.
  choose_staged(l, n);
  // A prefill batch streams its misses through the staging slots instead (see streams_batch),
  // except those prefetch() left to the CPU.
  const bool stream_all = streams_batch(n);
  if (stream_all && prefetched_layer_ != l) prefetch(l, n);
  // Split the items: experts with a VRAM copy (or streamed) run on the GPU, grouped by expert.
  cpu_items_.clear();
  group_of_.assign(static_cast<size_t>(n * K), -1);
  count_.assign(static_cast<size_t>(X), 0);
  int64_t total = 0;
  const bool decode = n <= kDeviceRoutingMaxTokens;  // counted apart for the decode bound
  if (decode) stats_.decode += static_cast<uint64_t>(n * K);
  for (int64_t i = 0; i < n * K; ++i) {
    const int32_t e = rids_[static_cast<size_t>(i)];
    // A miss copied this visit (into the pool or a staging slot) counts as streamed.
    const bool resident =
        !staged_[static_cast<size_t>(e)].gate && residency_->find(l, e) != nullptr;
    if (resident && decode) ++stats_.decode_resident;
    if (resident || gpu_copy(l, e) || (stream_all && !prefill_cpu_[static_cast<size_t>(e)])) {
      ++(resident ? stats_.resident : stats_.streamed);
      group_of_[static_cast<size_t>(i)] = e;
      ++count_[static_cast<size_t>(e)];
      ++total;
    } else {
      cpu_items_.push_back({static_cast<int32_t>(i / K), e, rweights_[static_cast<size_t>(i)]});
      ++stats_.cpu;
    }
  }

  cpu_experts_->note_split(l, n, total, static_cast<int64_t>(cpu_items_.size()));
  // The CPU's share starts now: on the runner thread it computes while this thread enqueues the
  // GPU's share (and the caller the next layer's attention).
  if (!cpu_items_.empty()) {
    runner_->start(l, h_xn_.get<float>(), n, cpu_items_, h_cpu_out_.get<float>());
    cpu_timed_ = profiler_ && n <= kDeviceRoutingMaxTokens;
    cpu_prefill_timed_ = stream_all ? prefill_cpu_n_ : 0;
  }
  copy_staged(l, stream);

  if (!stream_all) streamed_.clear();
  // Streamed chunks are consumed (their ring places freed) even when the CPU got every item.
  if (total > 0 || !streamed_.empty()) {
    // Groups: the experts with a VRAM copy that have rows, in expert order, then every expert
    // prefetch() streams (rows or not); streamed group k computes from staging slot
    // k % staging_slots_.
    int32_t n_resident = 0;
    for (int64_t e = 0; e < X; ++e) {
      if (count_[static_cast<size_t>(e)] > 0 && gpu_copy(l, static_cast<int32_t>(e))) ++n_resident;
    }
    const int32_t n_groups = n_resident + static_cast<int32_t>(streamed_.size());
    MetaWriter w(h_meta_.get<unsigned char>());
    const void** wg = w.take<const void*>(n_groups);
    const void** wu = w.take<const void*>(n_groups);
    const void** wd = w.take<const void*>(n_groups);
    int32_t* offsets = w.take<int32_t>(n_groups + 1);
    int32_t* x_rows = w.take<int32_t>(total);
    int32_t* ident = w.take<int32_t>(total);
    int32_t* tok_off = w.take<int32_t>(n + 1);
    int32_t* rows = w.take<int32_t>(total);
    float* weights = w.take<float>(total);
    // next_row_[e] is where expert e's next item goes.
    next_row_.assign(static_cast<size_t>(X), 0);
    int32_t g = 0, acc = 0;
    offsets[0] = 0;
    const auto add_group = [&](int64_t e, const ResidentExpert& r) {
      wg[g] = r.gate;
      wu[g] = r.up;
      wd[g] = r.down;
      next_row_[static_cast<size_t>(e)] = acc;
      acc += count_[static_cast<size_t>(e)];
      offsets[++g] = acc;
    };
    for (int64_t e = 0; e < X; ++e) {
      const ResidentExpert* r = gpu_copy(l, static_cast<int32_t>(e));
      if (count_[static_cast<size_t>(e)] > 0 && r) add_group(e, *r);
    }
    for (size_t k = 0; k < streamed_.size(); ++k) {
      add_group(streamed_[k], streamed_view(l, static_cast<int64_t>(k)));
    }
    int32_t k = 0;
    for (int64_t t = 0; t < n; ++t) {
      tok_off[t] = k;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = group_of_[static_cast<size_t>(t * K + j)];
        if (e < 0) continue;
        const int32_t row = next_row_[static_cast<size_t>(e)]++;
        x_rows[row] = static_cast<int32_t>(t);
        rows[k] = row;
        weights[k] = rweights_[static_cast<size_t>(t * K + j)];
        ++k;
      }
    }
    tok_off[n] = k;
    for (int32_t i = 0; i < total; ++i) ident[i] = i;

    unsigned char* hbase = h_meta_.get<unsigned char>();
    unsigned char* dbase = d_meta_.as<unsigned char>();
    auto dev = [&](const void* host_ptr) {
      return dbase + (static_cast<const unsigned char*>(host_ptr) - hbase);
    };
    // Through the SMs: a copy-engine transfer would queue behind the prefill's chunk copies.
    cuda::copy_from_host(dbase, hbase, w.size(), stream);

    const model::ExpertLayerTensors& et = tensors_[static_cast<size_t>(l)];
    const auto* d_off = reinterpret_cast<const int32_t*>(dev(offsets));
    const auto* d_xrows = reinterpret_cast<const int32_t*>(dev(x_rows));
    const auto* d_ident = reinterpret_cast<const int32_t*>(dev(ident));
    const auto* d_wg = reinterpret_cast<const void* const*>(dev(wg));
    const auto* d_wu = reinterpret_cast<const void* const*>(dev(wu));
    const auto* d_wd = reinterpret_cast<const void* const*>(dev(wd));
    float* dg = d_g_.as<float>();
    float* du = d_u_.as<float>();
    float* dh = d_h_.as<float>();
    float* dy = d_y_.as<float>();
    // Every launch of the batch gets the batch's largest group as its bound, so an expert's rows
    // take the same kernel (FP32 GEMV up to 8 rows, tensor cores above) whichever launch they
    // fall in: streamed and resident prefill then give the same bits.
    int64_t max_rows = 0;
    for (int32_t i = 0; i < n_groups; ++i) {
      max_rows = std::max(max_rows, int64_t{offsets[i + 1] - offsets[i]});
    }
    // Groups [g0, g1): their rows are offsets[g0] .. offsets[g1] - 1 of every scratch matrix.
    const auto compute = [&](int32_t g0, int32_t g1) {
      if (g1 <= g0) return;
      const int64_t r0 = offsets[g0], n_rows = offsets[g1] - offsets[g0];
      if (n_rows == 0) return;  // streamed experts the batch did not route to
      batch_.grouped_matmul(et.gate.type(), E, F, et.gate.row_bytes, d_wg + g0, d_off + g0, g1 - g0,
                            d_xrows, n_rows, max_rows, xn, E, dg);
      batch_.grouped_matmul(et.up.type(), E, F, et.up.row_bytes, d_wu + g0, d_off + g0, g1 - g0,
                            d_xrows, n_rows, max_rows, xn, E, du);
      batch_.swiglu(dg + r0 * F, du + r0 * F, dh + r0 * F, n_rows * F);
      batch_.grouped_matmul(et.down.type(), F, E, et.down.row_bytes, d_wd + g0, d_off + g0, g1 - g0,
                            d_ident, n_rows, max_rows, dh, F, dy);
    };
    MOE_CUDA_CHECK(cudaEventRecord(gpu_t0_->get(), stream));
    compute(0, n_resident);
    if (!streamed_.empty()) stream_groups(l, n_resident, compute, stream);
    prefetched_layer_ = -1;
    batch_.combine_rows(dy, reinterpret_cast<const int32_t*>(dev(tok_off)),
                        reinterpret_cast<const int32_t*>(dev(rows)),
                        reinterpret_cast<const float*>(dev(weights)), n, E, /*accumulate=*/true,
                        out);
    submit(stream);
    if (!staged_ids_.empty()) {
      // A later prefill copies into these slots only after this step computed from them.
      for (const auto& e : slots_free_) MOE_CUDA_CHECK(cudaEventRecord(e->get(), stream));
    }
    MOE_CUDA_CHECK(cudaEventRecord(gpu_t1_->get(), stream));
    gpu_timed_ = true;
    gpu_prefill_timed_ = stream_all ? static_cast<int64_t>(streamed_.size()) : 0;
  }

  // The CPU's share joins the GPU's once it is done.
  if (!cpu_items_.empty()) {
    runner_->enqueue_wait(stream);
    // Read from pinned memory by the SMs, for the same reason as the expert lists.
    cuda::add_inplace(out, h_cpu_out_.get<float>(), n * E, stream);
  }
}

model::ExpertRuntimeStats RoutedExpertsGpu::runtime() const {
  model::ExpertRuntimeStats r;
  r.items_vram = stats_.resident;
  r.items_pcie = stats_.streamed;
  r.items_cpu = stats_.cpu;
  r.pcie_bytes = stats_.pcie_bytes;
  r.admitted = stats_.admitted;
  r.evictions = static_cast<uint64_t>(residency_->evictions());
  r.cpu_busy_ms = cpu_busy_us_ / 1e3;
  r.gpu_busy_ms = gpu_busy_us_ / 1e3;
  r.pcie_gbps = cal_.h2d_gbps;
  if (profiler_ && profiler_->pcie_us_per_expert() > 0) {
    // The profiler's refined copy time per expert (copies of one decode visit, back to back).
    r.pcie_gbps =
        static_cast<double>(residency_->slot_bytes()) / (profiler_->pcie_us_per_expert() * 1e3);
  }
  r.cpu_us_per_expert = cal_.cpu_us_at(cal_threads_);
  r.gpu_us_per_expert = cal_.gpu_us_per_expert;
  r.vram_used_bytes = budget_.used();
  r.vram_budget_bytes = budget_.limit();
  r.decode_items = stats_.decode;
  r.decode_items_vram = stats_.decode_resident;
  r.dense_bytes = budget_.used(VramUse::Weights);
  uint64_t all_layers = 0;  // layers mix quantizations (e.g. Q6_K down in some): the mean
  for (const auto& t : tensors_) all_layers += expert_bytes(t);
  r.expert_bytes = all_layers / tensors_.size();
  r.experts_per_token = static_cast<uint64_t>(cfg_.n_layer * cfg_.n_expert_used);
  r.gpu_gbps = cal_.gpu_gbps;
  r.pcie_lane = profiler_ != nullptr || stream_share_ > 0;
  return r;
}

std::string RoutedExpertsGpu::stats() const {
  const uint64_t all = stats_.resident + stats_.streamed + stats_.cpu;
  if (all == 0) return "no routed experts computed yet";
  const auto pct = [&](uint64_t v) {
    char b[16];
    std::snprintf(b, sizeof b, "%.1f%%", 100.0 * static_cast<double>(v) / static_cast<double>(all));
    return std::string(b);
  };
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.2f GiB", static_cast<double>(stats_.pcie_bytes) / (1u << 30));
  std::string s = "routed expert items: " + std::to_string(all) + ", " + pct(stats_.resident) +
                  " on VRAM copies, " + pct(stats_.streamed) + " copied over PCIe (" + gib + "), " +
                  pct(stats_.cpu) + " on the CPU";
  if (stats_.admitted > 0) {
    s += "; " + std::to_string(stats_.admitted) + " copied experts admitted into the pool (" +
         std::to_string(residency_->evictions()) + " evictions)";
  }
  char busy[160];
  std::snprintf(busy, sizeof busy,
                "; busy: CPU share %.1f ms, GPU experts of split layers %.1f ms; the GPU waited "
                "%.1f ms for host routing (host work %.1f ms)",
                cpu_busy_us_ / 1e3, gpu_busy_us_ / 1e3, route_wait_us_ / 1e3, route_host_us_ / 1e3);
  s += busy;
  if (prefill_cpu_experts_ > 0) {
    char b[128];
    std::snprintf(b, sizeof b, "; prefill: %llu streamed experts computed on the CPU instead",
                  static_cast<unsigned long long>(prefill_cpu_experts_));
    s += b;
    if (prefill_cpu_us_per_expert_ > 0 && prefill_gpu_us_per_expert_ > 0) {
      std::snprintf(b, sizeof b, " (last layers: CPU %.0f us, GPU %.0f us per expert)",
                    prefill_cpu_us_per_expert_, prefill_gpu_us_per_expert_);
      s += b;
    }
  }
  if (profiler_) s += "; " + profiler_->summary();
  return s;
}

void RoutedExpertsGpu::join_runner() {
  const bool had_job = runner_->pending();
  const int64_t prefill_experts = cpu_prefill_timed_;
  cpu_prefill_timed_ = 0;
  runner_->join();
  if (!had_job) return;
  cpu_busy_us_ += runner_->last_us();
  if (prefill_experts > 0) {
    average(prefill_cpu_us_per_expert_, runner_->last_us() / static_cast<double>(prefill_experts));
  }
}

void RoutedExpertsGpu::finish() { join_runner(); }

void RoutedExpertsGpu::abandon() noexcept {
  batch_.clear();
  try {
    join_runner();
  } catch (...) {
    // The forward is failing already; its first error is the one reported.
  }
}

void RoutedExpertsGpu::measure_split() {
  // Called after run() joined the runner and synchronised the stream: the last decode layer's
  // CPU job and its copies (events around them on the stream) are done.
  if (cpu_timed_) profiler_->record_cpu(runner_->last_items(), runner_->last_us());
  cpu_timed_ = false;
  if (pcie_timed_ > 0) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, pcie_t0_->get(), pcie_t1_->get()) == cudaSuccess) {
      profiler_->record_pcie(pcie_timed_, static_cast<double>(ms) * 1000.0);
    } else {
      (void)cudaGetLastError();  // not recorded (an error path): skip the sample
    }
    pcie_timed_ = 0;
  }
}

bool RoutedExpertsGpu::streams_batch(int64_t n) const {
  // Prefill: a batch of this size uses most of a layer's experts, which cross PCIe (55 GB/s on
  // the H200 host) far faster than the CPU computes them for so many tokens (~50 tokens/s).
  return !copy_streams_.empty() && pin_->pinned() && n >= kStreamBatchMinTokens;
}

unsigned char* RoutedExpertsGpu::staging_slot(int64_t k) const {
  return staging_.as<unsigned char>() +
         static_cast<size_t>(k % staging_slots_) * residency_->slot_bytes();
}

int64_t RoutedExpertsGpu::prefill_cpu_count(int64_t m) const {
  if (m == 0) return 0;
  if (prefill_cpu_share_ >= 0) {
    return std::min<int64_t>(m, std::llround(static_cast<double>(m) * prefill_cpu_share_));
  }
  // Until both sides have been timed, one expert gives the CPU's first measurement.
  if (prefill_cpu_us_per_expert_ <= 0 || prefill_gpu_us_per_expert_ <= 0) return 1;
  // The split that ends both sides of a layer together (FreeToken's q = m * B_gpu / (B_gpu +
  // B_cpu), in times per expert). The GPU's time per streamed expert is what the layers took with
  // the CPU busy beside them, copies waited for included, so a CPU that slows the link or the
  // thread driving the GPU gets fewer experts.
  // At least one expert, so a slow first measurement (a cold CPU) is measured again and not
  // kept for good.
  const double g = prefill_gpu_us_per_expert_, c = prefill_cpu_us_per_expert_;
  return std::clamp<int64_t>(static_cast<int64_t>(static_cast<double>(m) * g / (g + c)), 1, m);
}

void RoutedExpertsGpu::prefetch(int64_t l, int64_t n) {
  prefetched_layer_ = -1;
  std::fill(prefill_cpu_.begin(), prefill_cpu_.end(), 0);
  prefill_cpu_n_ = 0;
  if (!streams_batch(n)) return;
  // Every expert without a VRAM copy: a batch this size routes to nearly all of them (512 tokens
  // miss one of 128 experts with probability (1 - 8/128)^512), and copying before routing is
  // known lets the copies overlap the layer's attention.
  std::vector<int32_t>& cand = prefill_candidates_;
  cand.clear();
  for (int64_t e = 0; e < cfg_.n_expert; ++e) {
    if (!residency_->find(l, e)) cand.push_back(static_cast<int32_t>(e));
  }
  // The CPU takes the least routed of them lately: its time grows with an expert's tokens, a
  // copy's does not.
  const int64_t c = prefill_cpu_count(static_cast<int64_t>(cand.size()));
  prefill_cpu_n_ = c;
  if (c > 0) {
    std::vector<int32_t>& coldest = prefill_coldest_;
    coldest.assign(cand.begin(), cand.end());
    std::partial_sort(coldest.begin(), coldest.begin() + c, coldest.end(),
                      [&](int32_t a, int32_t b) {
                        const double sa = residency_->score(l, a), sb = residency_->score(l, b);
                        return sa != sb ? sa < sb : a < b;
                      });
    for (int64_t i = 0; i < c; ++i)
      prefill_cpu_[static_cast<size_t>(coldest[static_cast<size_t>(i)])] = 1;
    prefill_cpu_experts_ += static_cast<uint64_t>(c);
  }
  // The rest stream, in expert order (runs of consecutive experts move in one copy).
  streamed_.clear();
  for (int32_t e : cand) {
    if (!prefill_cpu_[static_cast<size_t>(e)]) streamed_.push_back(e);
  }
  prefetched_layer_ = l;
  layer_chunk0_ = chunk_seq_;
  const auto n_chunks = (static_cast<int64_t>(streamed_.size()) + chunk_ - 1) / chunk_;
  chunk_seq_ += n_chunks;
  for (int64_t c = 0; c < std::min(n_chunks, ring_); ++c) copy_chunk(l, c);
}

ResidentExpert RoutedExpertsGpu::streamed_view(int64_t l, int64_t k) const {
  // Chunks go round the ring across layers too, so the next layer's first chunks are copied
  // while this layer's last ones are computed.
  const int64_t h = (layer_chunk0_ + k / chunk_) % ring_;
  return residency_->chunk_view(l, staging_slot(h * chunk_), chunk_, k % chunk_);
}

void RoutedExpertsGpu::copy_chunk(int64_t l, int64_t c) {
  const auto n = static_cast<int64_t>(streamed_.size());
  const int64_t h = (layer_chunk0_ + c) % ring_;
  cudaStream_t copy = copy_streams_[static_cast<size_t>(h) % copy_streams_.size()]->get();
  // The place is free once `stream` computed the chunk that held it (or a decode step used it).
  MOE_CUDA_CHECK(cudaStreamWaitEvent(copy, slots_free_[h]->get(), 0));
  // Runs of consecutive experts (streamed_ is in expert order) move in one copy per matrix.
  unsigned char* chunk = staging_slot(h * chunk_);
  const int64_t end = std::min(n, (c + 1) * chunk_);
  for (int64_t k = c * chunk_; k < end;) {
    int64_t run = 1;
    while (k + run < end &&
           streamed_[static_cast<size_t>(k + run)] == streamed_[static_cast<size_t>(k)] + run) {
      ++run;
    }
    residency_->stage_run(l, streamed_[static_cast<size_t>(k)], run, chunk, chunk_, k % chunk_,
                          copy);
    stats_.pcie_bytes +=
        static_cast<uint64_t>(run) * expert_bytes(tensors_[static_cast<size_t>(l)]);
    k += run;
  }
  MOE_CUDA_CHECK(cudaEventRecord(slots_ready_[h]->get(), copy));
}

void RoutedExpertsGpu::stream_groups(int64_t l, int32_t first_group,
                                     const std::function<void(int32_t, int32_t)>& compute,
                                     cudaStream_t stream) {
  // Chunks 0 .. ring_ - 1 were started by prefetch(); chunk c + ring_ is copied once chunk c is
  // computed.
  const auto n = static_cast<int64_t>(streamed_.size());
  const int64_t n_chunks = (n + chunk_ - 1) / chunk_;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t h = (layer_chunk0_ + c) % ring_;
    submit(stream);  // what was recorded before the wait runs before it
    MOE_CUDA_CHECK(cudaStreamWaitEvent(stream, slots_ready_[h]->get(), 0));
    const auto g0 = static_cast<int32_t>(first_group + c * chunk_);
    const auto g1 = static_cast<int32_t>(first_group + std::min(n, (c + 1) * chunk_));
    compute(g0, g1);
    submit(stream);
    MOE_CUDA_CHECK(cudaEventRecord(slots_free_[h]->get(), stream));
    if (c + ring_ < n_chunks) copy_chunk(l, c + ring_);
  }
}

model::LayerTrace RoutedExpertsGpu::trace(int64_t l, int64_t pos0, int64_t n,
                                          const float* l_out) const {
  return model::layer_trace(cfg_, l, pos0, n, h_rlogits_.get<float>(), rprobs_.data(), rids_.data(),
                            rweights_.data(), l_out);
}

void RoutedExpertsGpu::after_forward() {
  // Refill at 1, 8, 64, ... routed items: early from the first prompt, then as the profile
  // settles; each refill copies only the experts that change. The saved profile follows.
  if (residency_->routed() < refill_at_) return;
  if (residency_->pool_slots() > 0) residency_->refill();
  refill_at_ = std::max<uint64_t>(refill_at_ * 8, residency_->routed() + 1);
  save_profile_or_warn();  // the forward succeeded: a full disk must not fail it
}

void RoutedExpertsGpu::save_profile() const {
  if (profile_path_.empty()) return;
  model::RoutingProfile p{cfg_.arch, cfg_.n_layer, cfg_.n_expert, residency_->counts()};
  p.save(profile_path_);
}

void RoutedExpertsGpu::save_profile_or_warn() const noexcept {
  try {
    save_profile();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe: %s\n", e.what());
  }
}

RoutedExpertsGpu::~RoutedExpertsGpu() { save_profile_or_warn(); }

}  // namespace moe::gpu
