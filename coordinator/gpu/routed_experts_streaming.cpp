// RoutedExpertsGpu's streamed prefill: a batch of kStreamBatchMinTokens+ tokens copies the
// CPU-homed experts it uses over PCIe through a ring of staging chunks, the copies started before
// the layer's attention (prefetch()) and each chunk computed once it is in VRAM, while the CPU
// computes the share it is balanced to take (prefill_cpu_count()).
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "coordinator/gpu/routed_experts_gpu.h"
#include "coordinator/gpu/routed_experts_gpu_internal.h"
#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {

using routed_internal::expert_bytes;

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

}  // namespace moe::gpu
