// RoutedExpertsGpu's calibration: the rates that decide how a decode layer's CPU-homed misses are
// split between PCIe copies and the CPU, measured on this machine with the model's own experts
// and kernels, cached per machine (measuring takes about a second; a cached start takes none).
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/ggml_type.h"
#include "coordinator/gpu/routed_experts_gpu.h"
#include "experts/cpu_expert_executor.h"
#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

std::string device_name() {
  int dev = 0;
  cudaDeviceProp p{};
  MOE_CUDA_CHECK(cudaGetDevice(&dev));
  MOE_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return p.name;
}

// Milliseconds between two events that have completed.
double elapsed_us(const CudaEvent& a, const CudaEvent& b) {
  float ms = 0;
  MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, a.get(), b.get()));
  return static_cast<double>(ms) * 1000.0;
}

}  // namespace

void RoutedExpertsGpu::calibrate(const gguf::GgufFile& f, cpu::ThreadPool& pool, bool recalibrate) {
  int64_t l = 0;  // measured on the first CPU-homed layer (every layer has the same shapes)
  while (l < cfg_.n_layer && residency_->layer_on_gpu(l)) ++l;
  if (l == cfg_.n_layer) return;
  const model::ExpertLayerTensors& t = tensors_[static_cast<size_t>(l)];
  cal_threads_ = pool.size();
  // The figures hold for this CPU, GPU, thread count, expert quantization and copy source.
  std::string desc;
  for (const auto* m : {&t.gate, &t.up, &t.down}) {
    desc += std::string(ggml_type_info_or_throw(m->type()).name) + ",";
  }
  desc += std::to_string(t.gate.expert_bytes() + t.up.expert_bytes() + t.down.expert_bytes());
  desc += pin_ && pin_->pinned() ? ",pinned" : ",pageable";
  const std::string path = model::default_calibration_path();
  try {
    const std::string key = model::machine_key(device_name(), cal_threads_, desc);
    std::optional<model::MachineCalibration> cached;
    if (!recalibrate) {
      try {
        cached = model::load_calibration(path, key);
      } catch (const Error& e) {
        std::fprintf(stderr, "moe: %s (measuring again)\n", e.what());
      }
    }
    if (cached) {
      cal_ = *cached;
      cal_cached_ = true;
    } else {
      model::MachineCalibration c;
      c.key = key;
      c.measured_at = model::utc_now_iso8601();
      const int items = static_cast<int>(cfg_.n_expert_used);
      std::vector<int64_t> cpu_layers;  // every CPU-homed layer: a fresh layer per run
      for (int64_t i = 0; i < cfg_.n_layer; ++i) {
        if (!residency_->layer_on_gpu(i)) cpu_layers.push_back(i);
      }
      // A timed run's weights were last read 1 GiB of other weights earlier: beyond the
      // last-level cache (with 8 runs between, the H200 host's large L3 served part of them and
      // the CPU rate came out above its read bandwidth).
      constexpr int kReps = 8;
      const int warm = model::calibration_warm_runs(
          int64_t{1} << 30, static_cast<int64_t>(residency_->slot_bytes()), items, kReps,
          static_cast<int64_t>(cpu_layers.size()), cfg_.n_expert);
      c.cpu_us_per_expert = model::measure_cpu_expert_rates(
          [&](cpu::ThreadPool& p) { return model::cpu_experts_for(f, p); }, cpu_layers,
          cfg_.n_expert, cfg_.n_embd, model::calibration_thread_counts(cal_threads_), items, kReps,
          cpu::ThreadPool::kDefaultSpin, warm);
      cal_ = c;
      cal_cached_ = false;  // a live recalibration replaces cached rates
      measure_gpu_rates(l);
      model::save_calibration(path, cal_);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "moe: calibration: %s\n", e.what());
  }
  seed_profiler();
}

void RoutedExpertsGpu::seed_profiler() {
  if (profiler_ && cal_.h2d_gbps > 0) {
    const double copy_us = static_cast<double>(residency_->slot_bytes()) / (cal_.h2d_gbps * 1e3);
    profiler_->seed(cal_.cpu_us_at(cal_threads_), copy_us);  // it times the copies alone
  }
}

void RoutedExpertsGpu::measure_gpu_rates(int64_t l) {
  // Only where experts cross PCIe: the staging slots hold the copies, and the kernels then run
  // on experts that are not in L2 (the slots together are larger than it).
  const int64_t K = cfg_.n_expert_used;
  if (copy_streams_.empty() || staging_slots_ < 2 * K) return;
  cudaStream_t s = copy_streams_.front()->get();
  const model::ExpertLayerTensors& t = tensors_[static_cast<size_t>(l)];
  const double bytes =
      static_cast<double>(t.gate.expert_bytes() + t.up.expert_bytes() + t.down.expert_bytes());
  CudaEvent a(/*timing=*/true), b(/*timing=*/true);
  // PCIe: every slot filled with a different expert, as decode and prefill copy them; the first
  // pass is a warm-up.
  std::vector<double> per_expert;
  for (int pass = 0; pass < 4; ++pass) {
    MOE_CUDA_CHECK(cudaEventRecord(a.get(), s));
    for (int64_t k = 0; k < staging_slots_; ++k) {
      residency_->stage(l, k % cfg_.n_expert, staging_slot(k), s);
    }
    MOE_CUDA_CHECK(cudaEventRecord(b.get(), s));
    MOE_CUDA_CHECK(cudaEventSynchronize(b.get()));
    if (pass > 0) per_expert.push_back(elapsed_us(a, b) / static_cast<double>(staging_slots_));
  }
  cal_.h2d_gbps = bytes / (median(per_expert) * 1e3);

  // Device memory: one half of the staging slots copied onto the other (read + write).
  const size_t half = static_cast<size_t>(staging_slots_ / 2) * residency_->slot_bytes();
  std::vector<double> copy_us;
  for (int pass = 0; pass < 4; ++pass) {
    MOE_CUDA_CHECK(cudaEventRecord(a.get(), s));
    MOE_CUDA_CHECK(cudaMemcpyAsync(staging_slot(staging_slots_ / 2), staging_slot(0), half,
                                   cudaMemcpyDeviceToDevice, s));
    MOE_CUDA_CHECK(cudaEventRecord(b.get(), s));
    MOE_CUDA_CHECK(cudaEventSynchronize(b.get()));
    if (pass > 0) copy_us.push_back(elapsed_us(a, b));
  }
  cal_.gpu_gbps = 2.0 * static_cast<double>(half) / (median(copy_us) * 1e3);

  // GPU: one decode token's K experts from K different slots, rotating through the slots.
  reserve(1);
  std::vector<float> x(static_cast<size_t>(cfg_.n_embd));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : x) v = nd(rng);
  const VramBuffer x_buf = budget_.allocate(x.size() * 4, VramUse::Scratch, "calibration input");
  float* dx = x_buf.as<float>();
  MOE_CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  std::vector<const void*> ptrs(static_cast<size_t>(3 * K));
  // dr_.x_rows maps item i to token i / K: the first K items all read row 0, as wanted here.
  std::vector<double> per_item;
  const int64_t sets = staging_slots_ / K;
  for (int64_t r = 0; r <= 2 * sets; ++r) {
    for (int64_t i = 0; i < K; ++i) {
      const ResidentExpert e = residency_->slot_view(l, staging_slot((r % sets) * K + i));
      ptrs[static_cast<size_t>(i)] = e.gate;
      ptrs[static_cast<size_t>(K + i)] = e.up;
      ptrs[static_cast<size_t>(2 * K + i)] = e.down;
    }
    const size_t pb = static_cast<size_t>(K) * sizeof(void*);
    MOE_CUDA_CHECK(cudaMemcpy(dr_.gate, ptrs.data(), pb, cudaMemcpyHostToDevice));
    MOE_CUDA_CHECK(cudaMemcpy(dr_.up, ptrs.data() + K, pb, cudaMemcpyHostToDevice));
    MOE_CUDA_CHECK(cudaMemcpy(dr_.down, ptrs.data() + 2 * K, pb, cudaMemcpyHostToDevice));
    MOE_CUDA_CHECK(cudaEventRecord(a.get(), s));
    compute_items(l, K, dx);
    submit(s);
    MOE_CUDA_CHECK(cudaEventRecord(b.get(), s));
    MOE_CUDA_CHECK(cudaEventSynchronize(b.get()));
    if (r > 0) per_item.push_back(elapsed_us(a, b) / static_cast<double>(K));
  }
  cal_.gpu_us_per_expert = median(per_item);
}

std::string RoutedExpertsGpu::calibration_summary() const {
  std::string s = "calibration (";
  s += cal_cached_ ? "cached " + cal_.measured_at + ", --recalibrate measures again"
                   : "measured at start";
  s += "): ";
  char b[96];
  if (cal_.h2d_gbps > 0) {
    std::snprintf(b, sizeof b, "PCIe %.1f GB/s, GPU %.0f GB/s and %.1f us/expert, ", cal_.h2d_gbps,
                  cal_.gpu_gbps, cal_.gpu_us_per_expert);
    s += b;
  }
  std::snprintf(b, sizeof b, "CPU %.1f us/expert at %d threads", cal_.cpu_us_at(cal_threads_),
                cal_threads_);
  s += b;
  if (!cal_.cpu_us_per_expert.empty() && cal_.cpu_us_per_expert.front().first < cal_threads_) {
    std::snprintf(b, sizeof b, " (%.1f at 1)", cal_.cpu_us_per_expert.front().second);
    s += b;
  }
  return s;
}

}  // namespace moe::gpu
