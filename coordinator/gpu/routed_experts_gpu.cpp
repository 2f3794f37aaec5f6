// RoutedExpertsGpu's set-up (expert homes, pool, staging ring, device routing buffers), the entry
// of each layer (run(): device routing for resident decode, else the host round trip to
// run_split() in routed_experts_split.cpp), the device-routed path, and the stats and profile.
// The streamed prefill is in routed_experts_streaming.cpp, the calibration in
// routed_experts_calibration.cpp.
#include "coordinator/gpu/routed_experts_gpu.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "common/error.h"
#include "coordinator/gpu/gpu_upload.h"
#include "coordinator/gpu/routed_experts_gpu_internal.h"
#include "coordinator/model/batch_routing.h"
#include "coordinator/residency/routing_profile.h"
#include "experts/cpu_expert_executor.h"
#include "experts/tensor_table.h"
#include "kernels/cpu/activations.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/expert_lists.h"
#include "kernels/cuda/expert_matmul.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router.h"

namespace moe::gpu {
namespace {

using routed_internal::average;
using routed_internal::expert_bytes;
using routed_internal::MetaWriter;

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
  file_ = &f;
  direct_opt_ = opt.moe_direct_share;
  profiler_new_ = opt.moe_profiler_new;
  const int64_t X = cfg.n_expert;
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    tensors_.push_back(model::require_layer_experts(f, cfg, l));
  }
  // Before the pool is sized: the biases are dense weights in VRAM, not slot contents.
  if (cfg.expert_bias) {
    for (int64_t l = 0; l < cfg.n_layer; ++l) {
      const model::ExpertLayerTensors& t = tensors_[static_cast<size_t>(l)];
      LayerBiases b;
      b.router = upload_vector(
          budget, model::require_tensor(f, "blk." + std::to_string(l) + ".ffn_gate_inp.bias", {X}));
      b.gate = upload_vector(budget, *t.gate_bias);
      b.up = upload_vector(budget, *t.up_bias);
      b.down = upload_vector(budget, *t.down_bias);
      biases_.push_back(std::move(b));
    }
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
  if (opt.moe_direct_share > 0 && cpu_homed) {
    if (!f.loaded()) {
      throw Error("--moe-direct-share needs the model read into memory (-mmp 0 / --no-mmap)");
    }
    if (opt.moe_stream_share != 0 || opt.moe_host_routing) {
      throw Error(
          "--moe-direct-share works with decode routed on the GPU: not with --moe-stream-share "
          "or --moe-host-routing");
    }
  }
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
    if (stream_share_ < 0 && pin_->pinned()) make_profiler();
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
  const int64_t items = kDeviceListTokens * cfg.n_expert_used;
  const size_t bytes = static_cast<size_t>(kDeviceListTokens * X + 2 * items) * 4 +
                       static_cast<size_t>(3 * items) * sizeof(void*) +
                       static_cast<size_t>(6 * items + 2 * kDeviceListTokens + 4) * 4 + 512;
  dr_.buf = budget.allocate(bytes, VramUse::Scratch, "device routing");
  MetaWriter w(dr_.buf.as<unsigned char>());  // only offsets are computed here
  dr_.gate = w.take<const void*>(items);
  dr_.up = w.take<const void*>(items);
  dr_.down = w.take<const void*>(items);
  dr_.probs = w.take<float>(kDeviceListTokens * X);
  dr_.weights = w.take<float>(items);
  dr_.ids = w.take<int32_t>(items);
  dr_.ident = w.take<int32_t>(items + 1);
  dr_.x_rows = w.take<int32_t>(items);
  dr_.tok_off = w.take<int32_t>(kDeviceListTokens + 1);
  dr_.counter = w.take<unsigned>(1);
  dr_.hit_tok_off = w.take<int32_t>(kDeviceListTokens + 1);
  dr_.hit_rows = w.take<int32_t>(items);
  dr_.hit_weights = w.take<float>(items);
  if (w.size() > bytes) throw Error("device routing buffers: layout overflow");
  device_split_ = !opt.moe_host_routing && cpu_homed;
  device_groups_ = !opt.moe_host_routing;
  if (device_split_) {
    h_route_.reserve(64 + static_cast<size_t>(items) * 9 + 64);
    MetaWriter hw(h_route_.get<unsigned char>());
    route_flag_ = hw.take<uint32_t>(16);  // its own 64 bytes: the runner spins on it
    route_ids_ = hw.take<int32_t>(items);
    route_weights_ = hw.take<float>(items);
    route_hit_ = hw.take<uint8_t>(items);
    *route_flag_ = 0;
  }
  MOE_CUDA_CHECK(cudaMemset(dr_.counter, 0, sizeof(unsigned)));
  std::vector<int32_t> ident(static_cast<size_t>(items + 1)), x_rows(static_cast<size_t>(items)),
      tok_off(static_cast<size_t>(kDeviceListTokens + 1));
  for (int64_t i = 0; i <= items; ++i) ident[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < items; ++i) {
    x_rows[static_cast<size_t>(i)] = static_cast<int32_t>(i / cfg.n_expert_used);
  }
  for (int64_t t = 0; t <= kDeviceListTokens; ++t) {
    tok_off[static_cast<size_t>(t)] = static_cast<int32_t>(t * cfg.n_expert_used);
  }
  MOE_CUDA_CHECK(cudaMemcpy(dr_.ident, ident.data(), ident.size() * 4, cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(cudaMemcpy(dr_.x_rows, x_rows.data(), x_rows.size() * 4, cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(
      cudaMemcpy(dr_.tok_off, tok_off.data(), tok_off.size() * 4, cudaMemcpyHostToDevice));
  if (cpu_homed) calibrate(f, pool, opt.recalibrate);
  const bool pinned = pin_ && pin_->pinned();
  if (device_split_ && opt.moe_direct_share > 0 && stream_share_ == 0 && !pinned) {
    std::fprintf(stderr, "warning: --moe-direct-share off: the model is not page-locked (%s)\n",
                 pin_ ? pin_->refusal().c_str() : "not streaming");
  }
  update_direct();  // the share in effect, as a live change recomputes it
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
  // Expert lists: 3 pointers per group, 7 ints per item, 2 offset arrays, alignment slack.
  const size_t meta = 3 * sizeof(void*) * X + (7 * N * K + N + X + 2) * 4 + 256;
  scratch(d_meta_, meta / sizeof(float) + 1, "scratch expert lists");
  h_xn_.reserve(N * E * sizeof(float));
  h_cpu_out_.reserve(N * E * sizeof(float));
  h_rlogits_.reserve(N * X * sizeof(float));
  h_meta_.reserve(meta);
  grow(rprobs_, n * cfg_.n_expert);
  grow(rweights_, n * cfg_.n_expert_used);
  grow(rids_, n * cfg_.n_expert_used);
  grow(forced_, cfg_.n_expert_used);
  if (device_groups_) reserve_groups(n);
  reserved_ = n;
}

bool RoutedExpertsGpu::run(int64_t l, int64_t n, const float* xn, const cuda::DeviceMatrix& router,
                           float* rlogits, float* out, int64_t pos0,
                           const model::ForwardHooks* hooks, cudaStream_t stream,
                           const NormAfter* norm_after) {
  if (n > reserved_) throw Error("RoutedExpertsGpu: batch larger than reserved");
  if (splits_on_device(l, n, hooks)) {
    run_device_split(l, n, xn, router, rlogits, out, stream);
    return false;
  }
  const bool on_device = routes_on_device(l, n, hooks);
  // One decoding token routed on the device: logits, top-k and expert pointers in one launch.
  const bool fused_router = on_device && n == 1 && cuda::router_decode_supported(router.type);
  // Enqueued before the host may wait below, so the GPU need not idle for it.
  if (!fused_router) {
    cuda::matmul(router, xn, n, rlogits, stream);
    add_router_bias(l, rlogits, n, stream);
  }
  // The previous layer's CPU share: its buffers are reused below, and its error surfaces here.
  join_runner();
  if (!on_device && groups_on_device(l, n, hooks)) {
    run_grouped_on_device(l, n, xn, rlogits, out, stream);
    return false;
  }
  if (on_device) {
    if (fused_router) {
      cuda::RouterDecodeOut ro{
          rlogits,  dr_.probs, dr_.ids,  dr_.weights, residency_->device_table(l),
          dr_.gate, dr_.up,    dr_.down, dr_.counter};
      ro.bias = router_bias(l);
      ro.softmax_weight = softmax_weight();
      cuda::router_decode(router, xn, cfg_.n_expert_used, ro, stream);
    } else {
      cuda::router_topk(rlogits, n, cfg_.n_expert, cfg_.n_expert_used, dr_.probs, dr_.ids,
                        dr_.weights, stream, softmax_weight());
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
                     rweights_.data(), &pool_, cfg_.gating);
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
    if (!routes_on_device(l, n, hooks) && !groups_on_device(l, n, hooks)) return false;
  }
  return true;
}

void RoutedExpertsGpu::count_device_step(int64_t n) {
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    if (n > kDeviceRoutingMaxTokens) {
      count_grouped_layer(l, n);
    } else {
      count_device_layer(l, n);
    }
  }
}

bool RoutedExpertsGpu::routes_on_device(int64_t l, int64_t n,
                                        const model::ForwardHooks* hooks) const {
  // Hooks need the host's routing. Decode-sized batches only: one group per item would read an
  // expert's weights once per token; larger batches are grouped by expert (groups_on_device).
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
  if (cfg_.expert_act == model::ExpertActivation::SiluGlu && biases_.empty() &&
      cuda::fused_gate_up_supported(et.gate.type(), et.up.type(), E) &&
      et.gate.row_bytes == et.up.row_bytes) {
    batch_.grouped_gate_up_swiglu(et.gate.type(), E, F, et.gate.row_bytes, dr_.gate, dr_.up,
                                  dr_.ident, ig, dr_.x_rows, xn, E, dh);
  } else {
    batch_.grouped_matmul(et.gate.type(), E, F, et.gate.row_bytes, dr_.gate, dr_.ident, ig,
                          dr_.x_rows, items, 1, xn, E, dg);
    batch_.grouped_matmul(et.up.type(), E, F, et.up.row_bytes, dr_.up, dr_.ident, ig, dr_.x_rows,
                          items, 1, xn, E, du);
    record_activation(l, dg, du, dh, items, dr_.ids);
  }
  batch_.grouped_matmul(et.down.type(), F, E, et.down.row_bytes, dr_.down, dr_.ident, ig, dr_.ident,
                        items, 1, dh, F, d_y_.as<float>());
  record_down_bias(l, d_y_.as<float>(), items, dr_.ids);
}

void RoutedExpertsGpu::record_activation(int64_t l, float* dg, float* du, float* dh, int64_t rows,
                                         const int32_t* row_expert) {
  const int64_t F = cfg_.n_ff_exp;
  if (cfg_.expert_act == model::ExpertActivation::SiluGlu && biases_.empty()) {
    batch_.swiglu(dg, du, dh, rows * F);
    return;
  }
  if (cfg_.expert_act != model::ExpertActivation::SwigluOai) {
    throw Error("GPU experts: this expert activation takes no biases");
  }
  const LayerBiases* b = biases_.empty() ? nullptr : &biases_[static_cast<size_t>(l)];
  batch_.swiglu_oai(dg, du, dh, rows, F, b ? row_expert : nullptr,
                    b ? b->gate.as<float>() : nullptr, b ? b->up.as<float>() : nullptr,
                    cfg_.n_expert, model::kSwigluOaiAlpha, model::kSwigluOaiLimit);
}

void RoutedExpertsGpu::record_down_bias(int64_t l, float* dy, int64_t rows,
                                        const int32_t* row_expert) {
  if (biases_.empty()) return;
  batch_.add_expert_bias(dy, rows, cfg_.n_embd, row_expert,
                         biases_[static_cast<size_t>(l)].down.as<float>(), cfg_.n_expert);
}

const float* RoutedExpertsGpu::router_bias(int64_t l) const {
  return biases_.empty() ? nullptr : biases_[static_cast<size_t>(l)].router.as<float>();
}

void RoutedExpertsGpu::add_router_bias(int64_t l, float* rlogits, int64_t n, cudaStream_t stream) {
  if (const float* b = router_bias(l)) {
    cuda::add_bias(rlogits, n, cfg_.n_expert, cfg_.n_expert, b, stream);
  }
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
  if (direct_share_ > 0) {
    char share[16];
    std::snprintf(share, sizeof share, "%.2f", direct_share_);
    s += std::string("; the GPU reads ") + share + (direct_auto_ ? " (auto)" : "") +
         " of each decode layer's expected misses in place from the page-locked model";
  }
  if (stream_share_ > 0) {
    char share[16];
    std::snprintf(share, sizeof share, "%.2f", stream_share_);
    s += std::string("; ") + share + " of each decode layer's misses streamed over PCIe" +
         (pin_->pinned() ? "" : " (from pageable memory: " + pin_->refusal() + ")");
  }
  return s;
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
  r.gpu_route_wait_ms = route_wait_us_ / 1e3;
  r.cpu_route_wait_ms = runner_->routing_wait_us() / 1e3;
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
  r.pcie_lane = profiler_ != nullptr || stream_share_ > 0 || direct_share_ > 0;
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
  if (stats_.direct > 0) {
    s += "; " + std::to_string(stats_.direct) + " items read in place over PCIe by the GPU";
  }
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
  if (runner_->routing_wait_us() > 0) {
    std::snprintf(
        busy, sizeof busy,
        "; device-routed split layers: the CPU share waited %.1f ms for the GPU's routing",
        runner_->routing_wait_us() / 1e3);
    s += busy;
  }
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
  runner_->abandon();  // ends a job still waiting for device routing
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
  if (direct_share_ > 0) choose_direct();
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
