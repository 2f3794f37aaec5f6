// RoutedExpertsGpu's split of a host-routed layer: each (token, expert) item runs on the GPU when
// its expert has a VRAM copy or is copied over PCIe this step (decode misses through staging
// slots or the pool, prefill through the streamed chunks), else on the CPU share, which computes
// beside the GPU's kernels and is added into the output once done. Also the decode split's
// measurements for the profiler.
#include <algorithm>
#include <cmath>
#include <vector>

#include "coordinator/gpu/routed_experts_gpu.h"
#include "coordinator/gpu/routed_experts_gpu_internal.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/host_read.h"

namespace moe::gpu {

using routed_internal::expert_bytes;
using routed_internal::MetaWriter;

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
  const int64_t E = cfg_.n_embd, K = cfg_.n_expert_used;
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
  const int64_t total = split_items(l, n, stream_all);

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
  if (total > 0 || !streamed_.empty()) run_gpu_share(l, n, xn, out, total, stream_all, stream);

  // The CPU's share joins the GPU's once it is done.
  if (!cpu_items_.empty()) {
    runner_->enqueue_wait(stream);
    // Read from pinned memory by the SMs, for the same reason as the expert lists.
    cuda::add_inplace(out, h_cpu_out_.get<float>(), n * E, stream);
  }
}

int64_t RoutedExpertsGpu::split_items(int64_t l, int64_t n, bool stream_all) {
  const int64_t X = cfg_.n_expert, K = cfg_.n_expert_used;
  // Experts with a VRAM copy (or streamed) run on the GPU, grouped by expert.
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
  return total;
}

RoutedExpertsGpu::SplitLists RoutedExpertsGpu::write_split_lists(int64_t l, int64_t n,
                                                                 int64_t total) {
  const int64_t X = cfg_.n_expert, K = cfg_.n_expert_used;
  // Groups: the experts with a VRAM copy that have rows, in expert order, then every expert
  // prefetch() streams (rows or not); streamed group k computes from staging slot
  // k % staging_slots_.
  SplitLists s;
  for (int64_t e = 0; e < X; ++e) {
    if (count_[static_cast<size_t>(e)] > 0 && gpu_copy(l, static_cast<int32_t>(e))) ++s.n_resident;
  }
  s.n_groups = s.n_resident + static_cast<int32_t>(streamed_.size());
  MetaWriter w(h_meta_.get<unsigned char>());
  s.gate = w.take<const void*>(s.n_groups);
  s.up = w.take<const void*>(s.n_groups);
  s.down = w.take<const void*>(s.n_groups);
  s.offsets = w.take<int32_t>(s.n_groups + 1);
  s.x_rows = w.take<int32_t>(total);
  s.row_expert = w.take<int32_t>(total);
  s.ident = w.take<int32_t>(total);
  s.tok_off = w.take<int32_t>(n + 1);
  s.rows = w.take<int32_t>(total);
  s.weights = w.take<float>(total);
  s.bytes = w.size();
  // next_row_[e] is where expert e's next item goes.
  next_row_.assign(static_cast<size_t>(X), 0);
  int32_t g = 0, acc = 0;
  s.offsets[0] = 0;
  const auto add_group = [&](int64_t e, const ResidentExpert& r) {
    s.gate[g] = r.gate;
    s.up[g] = r.up;
    s.down[g] = r.down;
    next_row_[static_cast<size_t>(e)] = acc;
    acc += count_[static_cast<size_t>(e)];
    s.offsets[++g] = acc;
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
    s.tok_off[t] = k;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = group_of_[static_cast<size_t>(t * K + j)];
      if (e < 0) continue;
      const int32_t row = next_row_[static_cast<size_t>(e)]++;
      s.x_rows[row] = static_cast<int32_t>(t);
      s.row_expert[row] = e;
      s.rows[k] = row;
      s.weights[k] = rweights_[static_cast<size_t>(t * K + j)];
      ++k;
    }
  }
  s.tok_off[n] = k;
  for (int32_t i = 0; i < total; ++i) s.ident[i] = i;
  return s;
}

void RoutedExpertsGpu::run_gpu_share(int64_t l, int64_t n, const float* xn, float* out,
                                     int64_t total, bool stream_all, cudaStream_t stream) {
  const int64_t E = cfg_.n_embd, F = cfg_.n_ff_exp;
  const SplitLists s = write_split_lists(l, n, total);
  unsigned char* hbase = h_meta_.get<unsigned char>();
  unsigned char* dbase = d_meta_.as<unsigned char>();
  auto dev = [&](const void* host_ptr) {
    return dbase + (static_cast<const unsigned char*>(host_ptr) - hbase);
  };
  // Through the SMs: a copy-engine transfer would queue behind the prefill's chunk copies.
  cuda::copy_from_host(dbase, hbase, s.bytes, stream);

  const model::ExpertLayerTensors& et = tensors_[static_cast<size_t>(l)];
  const auto* d_off = reinterpret_cast<const int32_t*>(dev(s.offsets));
  const auto* d_xrows = reinterpret_cast<const int32_t*>(dev(s.x_rows));
  const auto* d_ident = reinterpret_cast<const int32_t*>(dev(s.ident));
  const auto* d_rowexp = reinterpret_cast<const int32_t*>(dev(s.row_expert));
  const auto* d_wg = reinterpret_cast<const void* const*>(dev(s.gate));
  const auto* d_wu = reinterpret_cast<const void* const*>(dev(s.up));
  const auto* d_wd = reinterpret_cast<const void* const*>(dev(s.down));
  float* dg = d_g_.as<float>();
  float* du = d_u_.as<float>();
  float* dh = d_h_.as<float>();
  float* dy = d_y_.as<float>();
  // Every launch of the batch gets the batch's largest group as its bound, so an expert's rows
  // take the same kernel (FP32 GEMV up to 8 rows, tensor cores above) whichever launch they
  // fall in: streamed and resident prefill then give the same bits.
  int64_t max_rows = 0;
  for (int32_t i = 0; i < s.n_groups; ++i) {
    max_rows = std::max(max_rows, int64_t{s.offsets[i + 1] - s.offsets[i]});
  }
  // Groups [g0, g1): their rows are offsets[g0] .. offsets[g1] - 1 of every scratch matrix.
  const auto compute = [&](int32_t g0, int32_t g1) {
    if (g1 <= g0) return;
    const int64_t r0 = s.offsets[g0], n_rows = s.offsets[g1] - s.offsets[g0];
    if (n_rows == 0) return;  // streamed experts the batch did not route to
    batch_.grouped_matmul(et.gate.type(), E, F, et.gate.row_bytes, d_wg + g0, d_off + g0, g1 - g0,
                          d_xrows, n_rows, max_rows, xn, E, dg);
    batch_.grouped_matmul(et.up.type(), E, F, et.up.row_bytes, d_wu + g0, d_off + g0, g1 - g0,
                          d_xrows, n_rows, max_rows, xn, E, du);
    record_activation(l, dg + r0 * F, du + r0 * F, dh + r0 * F, n_rows, d_rowexp + r0);
    batch_.grouped_matmul(et.down.type(), F, E, et.down.row_bytes, d_wd + g0, d_off + g0, g1 - g0,
                          d_ident, n_rows, max_rows, dh, F, dy);
    record_down_bias(l, dy + r0 * E, n_rows, d_rowexp + r0);
  };
  MOE_CUDA_CHECK(cudaEventRecord(gpu_t0_->get(), stream));
  compute(0, s.n_resident);
  if (!streamed_.empty()) stream_groups(l, s.n_resident, compute, stream);
  prefetched_layer_ = -1;
  batch_.combine_rows(dy, reinterpret_cast<const int32_t*>(dev(s.tok_off)),
                      reinterpret_cast<const int32_t*>(dev(s.rows)),
                      reinterpret_cast<const float*>(dev(s.weights)), n, E, /*accumulate=*/true,
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

}  // namespace moe::gpu
