// RoutedExpertsGpu's live policy (issue 29 §4): what moe.v1.Control's SetExpertPolicy changes
// between forwards, with the stream idle and the CPU share joined: the pool's size and grouping,
// the decode stream and direct shares, the prefill CPU share, the miss profiler, a
// recalibration. Every check runs before anything changes.
#include <algorithm>
#include <chrono>
#include <exception>
#include <string>

#include "coordinator/gpu/routed_experts_gpu.h"

namespace moe::gpu {

namespace {

using model::PolicyOutcome;

std::string mib_text(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

uint64_t RoutedExpertsGpu::pool_most_bytes() const {
  int64_t cpu_layers = 0;
  for (int64_t l = 0; l < cfg_.n_layer; ++l) cpu_layers += residency_->layer_on_gpu(l) ? 0 : 1;
  return static_cast<uint64_t>(cpu_layers * cfg_.n_expert) * residency_->slot_bytes();
}

model::ExpertPolicy RoutedExpertsGpu::policy() const {
  model::ExpertPolicy p;
  const auto auto_or = [](double v) { return v < 0 ? model::ExpertPolicy::kAutoShare : v; };
  p.slot_bytes = residency_->slot_bytes();
  p.pool_slots = residency_->pool_slots();
  p.pool_filled = residency_->pool_filled();
  p.pool_bytes = residency_->pool_bytes();
  p.pool_max_bytes = std::min<uint64_t>(p.pool_bytes + budget_.available(), pool_most_bytes());
  p.stream_share = auto_or(stream_share_);
  p.direct_share = auto_or(direct_opt_);
  p.direct_share_now = direct_share_;
  p.prefill_cpu_share = auto_or(prefill_cpu_share_);
  p.profiler_new = profiler_new_;
  p.grouping = residency_->grouping() == model::Grouping::Layout;
  p.changes = policy_changes_;
  p.recalibrated_ms = recalibrated_ms_;
  return p;
}

std::vector<model::LayerSplit> RoutedExpertsGpu::layer_split() const {
  std::vector<model::LayerSplit> v;
  const int64_t X = cfg_.n_expert;
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    if (residency_->layer_on_gpu(l)) {
      v.push_back({l, true, X, 0, 0});
      continue;
    }
    const auto [resident, in_place] = residency_->resident_and_direct(l);
    v.push_back({l, false, resident, in_place, X - resident - in_place});
  }
  return v;
}

PolicyOutcome RoutedExpertsGpu::check_policy(const model::ExpertPolicyChange& c) const {
  const bool cpu_homed = residency_->has_cpu_experts();
  const bool streaming = staging_slots_ > 0;  // staging slots and the model's pin exist
  const bool pinned = pin_ && pin_->pinned();
  if ((c.pool_mib || c.grouping || c.recalibrate) && !cpu_homed) {
    return {PolicyOutcome::Unsupported,
            "every layer's experts are in VRAM (no -cmoe / -ncmoe): there is no pool to resize "
            "or group and nothing to calibrate"};
  }
  if ((c.pool_mib || c.grouping) && exec_.remote()) {
    return {PolicyOutcome::Unsupported,
            "the pool cannot be rebuilt while the experts' kernels run in a moe-gpu-worker "
            "(--gpu-executor process): it maps the pool's VRAM at start"};
  }
  if (c.pool_mib) {
    // Whole slots, at most one per CPU-homed expert (more would stay empty).
    const uint64_t slot = std::max<uint64_t>(residency_->slot_bytes(), 1);
    const uint64_t asked = (static_cast<uint64_t>(*c.pool_mib) << 20) / slot * slot;
    const uint64_t want = std::min(asked, pool_most_bytes());
    const uint64_t have = residency_->pool_bytes() + budget_.available();
    if (want > have) {
      return {PolicyOutcome::NoRoom, "a pool of " + std::to_string(*c.pool_mib) +
                                         " MiB does not fit: the VRAM budget has " +
                                         mib_text(have) + " for it (its own and what is free)"};
    }
  }
  const char* needs_read_in =
      " needs the model read into memory (-mmp 0 / --no-mmap) with CPU-homed experts from the "
      "start";
  if (c.stream_share && *c.stream_share != 0 && !streaming) {
    return {PolicyOutcome::Unsupported, std::string("--moe-stream-share") + needs_read_in};
  }
  if (c.stream_share && *c.stream_share < 0 && !pinned) {
    return {PolicyOutcome::Unsupported, "--moe-stream-share auto needs the model page-locked" +
                                            (pin_ ? " (" + pin_->refusal() + ")" : std::string())};
  }
  if (c.prefill_cpu_share && !streaming) {
    return {PolicyOutcome::Unsupported, std::string("--moe-prefill-cpu-share") + needs_read_in};
  }
  if (c.direct_share && *c.direct_share != 0) {
    if (!device_split_) {
      return {PolicyOutcome::Unsupported,
              "--moe-direct-share works with decode routed on the GPU: not with "
              "--moe-host-routing, nor without CPU-homed experts"};
    }
    if (!pinned) {
      return {PolicyOutcome::Unsupported, std::string("--moe-direct-share") + needs_read_in};
    }
  }
  return {};
}

PolicyOutcome RoutedExpertsGpu::set_policy(const model::ExpertPolicyChange& c) {
  PolicyOutcome o = check_policy(c);
  if (o.kind != PolicyOutcome::Applied) return o;
  join_runner();  // idle between forwards; surfaces nothing new
  try {
    if (c.recalibrate) {
      const auto t0 = std::chrono::steady_clock::now();
      calibrate(*file_, pool_, /*recalibrate=*/true);
      recalibrated_ms_ =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    if (c.pool_mib || c.grouping) {
      const uint64_t bytes =
          c.pool_mib ? static_cast<uint64_t>(*c.pool_mib) << 20 : residency_->pool_bytes();
      const model::Grouping g = !c.grouping   ? residency_->grouping()
                                : *c.grouping ? model::Grouping::Layout
                                              : model::Grouping::Off;
      residency_->reshape(bytes, g);
    }
    if (c.prefill_cpu_share) prefill_cpu_share_ = *c.prefill_cpu_share;
    if (c.profiler_new) profiler_new_ = *c.profiler_new;
    if (c.stream_share) stream_share_ = *c.stream_share;
    // The profiler exists exactly while the stream share is auto; a new mode or new rates give
    // it a fresh start.
    if (stream_share_ >= 0) {
      profiler_.reset();
    } else if (!profiler_ || c.profiler_new || c.recalibrate) {
      make_profiler();
    }
    if (c.direct_share) direct_opt_ = *c.direct_share;
    update_direct();  // after the pool and the stream share: which misses it may read in place
  } catch (const std::exception& e) {
    ++policy_changes_;
    return {PolicyOutcome::Failed,
            std::string("the change failed midway (") + e.what() + "); now: " + summary()};
  }
  ++policy_changes_;
  return {};
}

void RoutedExpertsGpu::make_profiler() {
  // Decode: up to kDeviceRoutingMaxTokens tokens' misses, at most a slot each.
  const int max_m = static_cast<int>(kDeviceRoutingMaxTokens * cfg_.n_expert_used);
  profiler_ = std::make_unique<model::MissSplitProfiler>(
      profiler_new_ ? model::MissSplitProfiler::Mode::New : model::MissSplitProfiler::Mode::Old,
      static_cast<int>(std::min<int64_t>(max_m, staging_slots_)));
  if (!pcie_t0_) {
    pcie_t0_ = std::make_unique<CudaEvent>(/*timing=*/true);
    pcie_t1_ = std::make_unique<CudaEvent>(/*timing=*/true);
  }
  pcie_timed_ = 0;  // timings taken for the old one are not this one's
  cpu_timed_ = false;
  seed_profiler();
}

void RoutedExpertsGpu::update_direct() {
  const bool can = device_split_ && stream_share_ == 0 && pin_ && pin_->pinned();
  direct_auto_ = direct_opt_ < 0;
  direct_share_ = !can ? 0 : direct_auto_ ? auto_direct_share() : direct_opt_;
  if (residency_->has_cpu_experts()) choose_direct();  // a share of 0 unmarks every expert
}

}  // namespace moe::gpu
