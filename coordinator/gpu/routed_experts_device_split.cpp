// RoutedExpertsGpu's device-routed split: a decode layer whose experts are partly in VRAM routes
// on the GPU like a fully resident one. The routing (ids, weights, which items the GPU computes)
// and the layer's input reach page-locked memory with a flag that the runner thread polls; the
// GPU goes straight on to its hits while the CPU computes the misses, and waits for the CPU's
// result through the runner's flag as before. No host synchronisation per layer (issue 29 §1).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "coordinator/gpu/routed_experts_gpu.h"
#include "coordinator/gpu/routed_experts_gpu_internal.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/expert_lists.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/router.h"

namespace moe::gpu {

bool RoutedExpertsGpu::splits_on_device(int64_t l, int64_t n,
                                        const model::ForwardHooks* hooks) const {
  // Decode misses copied over PCIe are chosen on the host (--moe-stream-share): host routing.
  const bool host_hooks = hooks && (hooks->force_experts || hooks->observe_layer);
  return device_split_ && !residency_->layer_on_gpu(l) && n <= kDeviceSplitMaxTokens &&
         !host_hooks && runner_->async() && !exec_.remote() && stream_share_ == 0 && !profiler_;
}

void RoutedExpertsGpu::run_device_split(int64_t l, int64_t n, const float* xn,
                                        const cuda::DeviceMatrix& router, float* rlogits,
                                        float* out, cudaStream_t stream) {
  const int64_t E = cfg_.n_embd, X = cfg_.n_expert, K = cfg_.n_expert_used;
  // The previous layer's CPU share reads the routing buffers and h_xn_ rewritten below.
  join_runner();
  const void* const* table = residency_->synced_table(l, stream);
  if (n == 1 && cuda::router_decode_supported(router.type)) {
    cuda::RouterDecodeOut ro{rlogits,  dr_.probs, dr_.ids,  dr_.weights, table,
                             dr_.gate, dr_.up,    dr_.down, dr_.counter};
    ro.bias = router_bias(l);
    ro.softmax_weight = softmax_weight();
    cuda::router_decode(router, xn, K, ro, stream);
  } else {
    cuda::matmul(router, xn, n, rlogits, stream);
    add_router_bias(l, rlogits, n, stream);
    cuda::router_topk(rlogits, n, X, K, dr_.probs, dr_.ids, dr_.weights, stream, softmax_weight());
    cuda::gather_expert_pointers(dr_.ids, n * K, table, X, dr_.gate, dr_.up, dr_.down, stream);
  }
  const uint32_t seq = ++route_seq_;
  cuda::publish_split_routing(dr_.ids, dr_.weights, dr_.gate, n, K, xn, E, seq,
                              {dr_.hit_tok_off, dr_.hit_rows, dr_.hit_weights, route_ids_,
                               route_weights_, route_hit_, h_xn_.get<float>(), route_flag_},
                              stream);
  runner_->start_when(
      route_flag_, seq, stream, [this, l, n] { return take_device_routing(l, n); }, l,
      h_xn_.get<float>(), n, h_cpu_out_.get<float>());
  // The hits: a miss's null pointers give NaN rows that the hit lists leave out.
  compute_items(l, n * K, xn);
  batch_.combine_rows(d_y_.as<float>(), dr_.hit_tok_off, dr_.hit_rows, dr_.hit_weights, n, E,
                      /*accumulate=*/true, out);
  submit(stream);
  runner_->enqueue_wait(stream);
  // Read from pinned memory by the SMs, as the host-routed split does.
  cuda::add_inplace(out, h_cpu_out_.get<float>(), n * E, stream);
}

std::span<const model::ExpertItem> RoutedExpertsGpu::take_device_routing(int64_t l, int64_t n) {
  // On the runner thread, once the GPU published layer l's routing; the host thread waits for
  // this job before it touches the residency, the counters or cpu_items_ again.
  const int64_t X = cfg_.n_expert, K = cfg_.n_expert_used;
  if (l == 0) residency_->tick(n);
  const double weight = 1.0 / static_cast<double>(n);
  cpu_items_.clear();
  int64_t hits = 0, direct = 0;
  for (int64_t i = 0; i < n * K; ++i) {
    const int32_t e = route_ids_[i];
    if (e < 0 || e >= X) {
      throw Error("device routing: expert " + std::to_string(e) + " of layer " + std::to_string(l) +
                  " out of range");
    }
    residency_->record(l, e, weight);
    if (route_hit_[i]) {
      ++hits;
      if (direct_share_ > 0 && residency_->direct(l, e)) ++direct;
    } else {
      cpu_items_.push_back({static_cast<int32_t>(i / K), e, route_weights_[i]});
    }
  }
  const auto misses = static_cast<int64_t>(cpu_items_.size());
  stats_.resident += static_cast<uint64_t>(hits - direct);
  stats_.streamed += static_cast<uint64_t>(direct);
  stats_.direct += static_cast<uint64_t>(direct);
  stats_.pcie_bytes += static_cast<uint64_t>(direct) *
                       routed_internal::expert_bytes(tensors_[static_cast<size_t>(l)]);
  stats_.cpu += static_cast<uint64_t>(misses);
  if (n <= kDeviceRoutingMaxTokens) {  // counted apart for the decode bound, as split_items does
    stats_.decode += static_cast<uint64_t>(n * K);
    stats_.decode_resident += static_cast<uint64_t>(hits - direct);
  }
  cpu_experts_->note_split(l, n, hits, misses);
  return cpu_items_;
}

double RoutedExpertsGpu::auto_direct_share() const {
  const double cpu_us = cal_.cpu_us_at(cal_threads_);
  if (cal_.h2d_gbps <= 0 || cpu_us <= 0) return 0;
  const double pcie_us = static_cast<double>(residency_->slot_bytes()) / (cal_.h2d_gbps * 1e3);
  // Three quarters of the balance point: the in-place reads also delay the GPU's next routing,
  // which the CPU waits for (qwen3.6 at 6 GiB on the H200 host: best at 0.25, balance 0.27-0.34,
  // docs/performance-log.md).
  return 0.75 * cpu_us / (cpu_us + pcie_us);
}

void RoutedExpertsGpu::choose_direct() {
  const int64_t X = cfg_.n_expert;
  std::vector<int32_t> order;
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    if (residency_->layer_on_gpu(l)) continue;
    order.clear();
    double total = 0;
    for (int64_t e = 0; e < X; ++e) {
      if (residency_->find(l, e)) continue;
      order.push_back(static_cast<int32_t>(e));
      total += residency_->score(l, e);
    }
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return residency_->score(l, a) > residency_->score(l, b);
    });
    // While nothing is routed yet every expert is as likely: a count share.
    const auto by_count =
        static_cast<size_t>(std::lround(direct_share_ * static_cast<double>(order.size())));
    double taken = 0;
    size_t chosen = direct_share_ >= 1 ? order.size() : 0;  // 1: every one, routed yet or not
    for (; chosen < order.size(); ++chosen) {
      if (total > 0 ? taken >= direct_share_ * total : chosen >= by_count) break;
      taken += residency_->score(l, order[chosen]);
    }
    const model::ExpertLayerTensors& t = tensors_[static_cast<size_t>(l)];
    for (size_t i = 0; i < order.size(); ++i) {
      const int32_t e = order[i];
      ResidentExpert v;
      if (i < chosen) {
        v = {pin_->device_view(t.gate.data(e)), pin_->device_view(t.up.data(e)),
             pin_->device_view(t.down.data(e))};
        if (!v.gate || !v.up || !v.down) v = {};  // not mapped: the CPU computes it
      }
      residency_->set_direct(l, e, v);
    }
  }
}

}  // namespace moe::gpu
