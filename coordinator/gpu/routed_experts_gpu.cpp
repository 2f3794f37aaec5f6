#include "coordinator/gpu/routed_experts_gpu.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "coordinator/gpu/gpu_upload.h"
#include "coordinator/model/batch_routing.h"
#include "coordinator/model/cpu_expert_executor.h"
#include "coordinator/model/tensor_table.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/expert_lists.h"
#include "kernels/cuda/expert_matmul.h"
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

template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  return v.data();
}

}  // namespace

RoutedExpertsGpu::RoutedExpertsGpu(VramBudget& budget, const gguf::GgufFile& f,
                                   const model::ModelConfig& cfg, cpu::ThreadPool& pool,
                                   std::unique_ptr<model::ExpertExecutor> cpu_experts,
                                   const GpuOptions& opt, uint64_t other_bytes)
    : budget_(budget), cfg_(cfg) {
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
  uint64_t pool_bytes = 0;
  if (opt.moe_resident_mib > 0) {
    pool_bytes = static_cast<uint64_t>(opt.moe_resident_mib) << 20;
  } else if (opt.moe_resident_mib < 0) {
    const uint64_t need = gpu_expert_bytes + other_bytes + (uint64_t{kAutoPoolReserveMib} << 20);
    pool_bytes = budget.available() > need ? budget.available() - need : 0;
  }
  residency_ = std::make_unique<ExpertResidency>(budget, tensors_, gpu_home, X, pool_bytes);
  cpu_experts_ = cpu_experts ? std::move(cpu_experts) : model::cpu_experts_for(f, pool);

  // Device routing buffers and the constant index lists of the one-group-per-item layout.
  const int64_t items = kDeviceRoutingMaxTokens * cfg.n_expert_used;
  const size_t bytes = static_cast<size_t>(kDeviceRoutingMaxTokens * X + 2 * items) * 4 +
                       static_cast<size_t>(3 * items) * sizeof(void*) +
                       static_cast<size_t>(3 * items + kDeviceRoutingMaxTokens + 2) * 4 + 256;
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
  scratch(d_cpu_out_, N * E, "scratch cpu out");
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

void RoutedExpertsGpu::run(int64_t l, int64_t n, const float* xn, const float* rlogits, float* out,
                           int64_t pos0, const model::ForwardHooks* hooks, cudaStream_t stream) {
  if (n > reserved_) throw Error("RoutedExpertsGpu: batch larger than reserved");
  if (routes_on_device(l, n, hooks)) {
    cuda::router_topk(rlogits, n, cfg_.n_expert, cfg_.n_expert_used, dr_.probs, dr_.ids,
                      dr_.weights, stream);
    run_on_device(l, n, xn, out, stream);
    return;
  }
  const int64_t E = cfg_.n_embd, X = cfg_.n_expert, K = cfg_.n_expert_used;
  float* hl = h_rlogits_.get<float>();
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(hl, rlogits, static_cast<size_t>(n * X) * 4, cudaMemcpyDeviceToHost, stream));
  if (!residency_->layer_on_gpu(l)) {
    MOE_CUDA_CHECK(cudaMemcpyAsync(h_xn_.get(), xn, static_cast<size_t>(n * E) * 4,
                                   cudaMemcpyDeviceToHost, stream));
  }
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  model::route_batch(hl, n, X, K, l, pos0, hooks, forced_.data(), rprobs_.data(), rids_.data(),
                     rweights_.data());
  run_split(l, n, xn, out, stream);
}

bool RoutedExpertsGpu::routes_on_device(int64_t l, int64_t n,
                                        const model::ForwardHooks* hooks) const {
  // Hooks need the host's routing; prefill wants the host's grouping by expert (each expert's
  // weights read once for all its tokens), which one group per item would not give.
  const bool host_hooks = hooks && (hooks->force_experts || hooks->observe_layer);
  return residency_->layer_on_gpu(l) && n <= kDeviceRoutingMaxTokens && !host_hooks;
}

void RoutedExpertsGpu::run_on_device(int64_t l, int64_t n, const float* xn, float* out,
                                     cudaStream_t stream) {
  const int64_t E = cfg_.n_embd, X = cfg_.n_expert, K = cfg_.n_expert_used, F = cfg_.n_ff_exp;
  const int64_t items = n * K;
  cuda::gather_expert_pointers(dr_.ids, items, residency_->device_table(l), X, dr_.gate, dr_.up,
                               dr_.down, stream);
  const model::ExpertLayerTensors& et = tensors_[static_cast<size_t>(l)];
  const auto ig = static_cast<int32_t>(items);
  float* dg = d_g_.as<float>();
  float* du = d_u_.as<float>();
  float* dh = d_h_.as<float>();
  float* dy = d_y_.as<float>();
  cuda::grouped_matmul(et.gate.type(), E, F, et.gate.row_bytes, dr_.gate, dr_.ident, ig, dr_.x_rows,
                       items, 1, xn, E, dg, stream);
  cuda::grouped_matmul(et.up.type(), E, F, et.up.row_bytes, dr_.up, dr_.ident, ig, dr_.x_rows,
                       items, 1, xn, E, du, stream);
  cuda::swiglu(dg, du, dh, items * F, stream);
  cuda::grouped_matmul(et.down.type(), F, E, et.down.row_bytes, dr_.down, dr_.ident, ig, dr_.ident,
                       items, 1, dh, F, dy, stream);
  cuda::combine_rows(dy, dr_.tok_off, dr_.ident, dr_.weights, n, E, /*accumulate=*/true, out,
                     stream);
}

void RoutedExpertsGpu::run_split(int64_t l, int64_t n, const float* xn, float* out,
                                 cudaStream_t stream) {
  const int64_t E = cfg_.n_embd, X = cfg_.n_expert, K = cfg_.n_expert_used, F = cfg_.n_ff_exp;
  // Split the items: experts with a VRAM copy run on the GPU, grouped by expert.
  cpu_items_.clear();
  group_of_.assign(static_cast<size_t>(n * K), -1);
  count_.assign(static_cast<size_t>(X), 0);
  int64_t total = 0;
  for (int64_t i = 0; i < n * K; ++i) {
    const int32_t e = rids_[static_cast<size_t>(i)];
    residency_->record(l, e);
    if (residency_->find(l, e)) {
      group_of_[static_cast<size_t>(i)] = e;
      ++count_[static_cast<size_t>(e)];
      ++total;
    } else {
      cpu_items_.push_back({static_cast<int32_t>(i / K), e, rweights_[static_cast<size_t>(i)]});
    }
  }

  if (total > 0) {
    int32_t n_groups = 0;
    int64_t max_rows = 0;
    for (int64_t e = 0; e < X; ++e) {
      if (count_[static_cast<size_t>(e)] > 0) ++n_groups;
      max_rows = std::max<int64_t>(max_rows, count_[static_cast<size_t>(e)]);
    }
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
    // Groups in expert order; next_row_[e] is where expert e's next item goes.
    next_row_.assign(static_cast<size_t>(X), 0);
    int32_t g = 0, acc = 0;
    offsets[0] = 0;
    for (int64_t e = 0; e < X; ++e) {
      if (count_[static_cast<size_t>(e)] == 0) continue;
      const ResidentExpert* r = residency_->find(l, e);
      wg[g] = r->gate;
      wu[g] = r->up;
      wd[g] = r->down;
      next_row_[static_cast<size_t>(e)] = acc;
      acc += count_[static_cast<size_t>(e)];
      offsets[++g] = acc;
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
    MOE_CUDA_CHECK(cudaMemcpyAsync(dbase, hbase, w.size(), cudaMemcpyHostToDevice, stream));

    const model::ExpertLayerTensors& et = tensors_[static_cast<size_t>(l)];
    const auto* d_off = reinterpret_cast<const int32_t*>(dev(offsets));
    const auto* d_xrows = reinterpret_cast<const int32_t*>(dev(x_rows));
    float* dg = d_g_.as<float>();
    float* du = d_u_.as<float>();
    float* dh = d_h_.as<float>();
    float* dy = d_y_.as<float>();
    cuda::grouped_matmul(et.gate.type(), E, F, et.gate.row_bytes,
                         reinterpret_cast<const void* const*>(dev(wg)), d_off, n_groups, d_xrows,
                         total, max_rows, xn, E, dg, stream);
    cuda::grouped_matmul(et.up.type(), E, F, et.up.row_bytes,
                         reinterpret_cast<const void* const*>(dev(wu)), d_off, n_groups, d_xrows,
                         total, max_rows, xn, E, du, stream);
    cuda::swiglu(dg, du, dh, total * F, stream);
    cuda::grouped_matmul(et.down.type(), F, E, et.down.row_bytes,
                         reinterpret_cast<const void* const*>(dev(wd)), d_off, n_groups,
                         reinterpret_cast<const int32_t*>(dev(ident)), total, max_rows, dh, F, dy,
                         stream);
    cuda::combine_rows(dy, reinterpret_cast<const int32_t*>(dev(tok_off)),
                       reinterpret_cast<const int32_t*>(dev(rows)),
                       reinterpret_cast<const float*>(dev(weights)), n, E, /*accumulate=*/true, out,
                       stream);
  }

  // The CPU's share, computed while the GPU works on its own.
  if (!cpu_items_.empty()) {
    float* hout = h_cpu_out_.get<float>();
    cpu_experts_->run(l, h_xn_.get<float>(), n, cpu_items_, hout);
    MOE_CUDA_CHECK(cudaMemcpyAsync(d_cpu_out_.get(), hout, static_cast<size_t>(n * E) * 4,
                                   cudaMemcpyHostToDevice, stream));
    cuda::add_inplace(out, d_cpu_out_.as<float>(), n * E, stream);
  }
}

model::LayerTrace RoutedExpertsGpu::trace(int64_t l, int64_t pos0, int64_t n,
                                          const float* l_out) const {
  return model::layer_trace(cfg_, l, pos0, n, h_rlogits_.get<float>(), rprobs_.data(), rids_.data(),
                            rweights_.data(), l_out);
}

void RoutedExpertsGpu::after_forward() {
  // Refill at 1, 8, 64, ... routed items: early from the first prompt, then as the profile
  // settles; each refill copies only the experts that change.
  if (residency_->pool_slots() == 0 || residency_->routed() < refill_at_) return;
  residency_->refill();
  refill_at_ = std::max<uint64_t>(refill_at_ * 8, residency_->routed() + 1);
}

}  // namespace moe::gpu
