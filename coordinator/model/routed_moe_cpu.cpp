// RoutedMoeCpu: router, top k and the executor's sum for one layer.
#include "coordinator/model/routed_moe_cpu.h"

#include <span>

#include "coordinator/model/batch_routing.h"

namespace moe::model {
namespace {

template <typename T>
void grow(std::vector<T>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
}

}  // namespace

void RoutedMoeCpu::reserve(int64_t n) {
  const int64_t X = cfg_.n_expert, K = cfg_.n_expert_used;
  grow(rlogits_, n * X);
  grow(rprobs_, n * X);
  grow(rweights_, n * K);
  grow(rids_, n * K);
  grow(forced_, K);
  grow(items_, n * K);
}

void RoutedMoeCpu::run(int64_t l, const cpu::WeightMatrix& router, const float* xn, int64_t n,
                       int64_t pos0, const ForwardHooks* hooks, float* out, cpu::ThreadPool& pool,
                       cpu::MatmulScratch& mm, cpu::Isa isa, const float* router_bias) {
  const int64_t X = cfg_.n_expert, K = cfg_.n_expert_used;
  // The router runs in f32 (F32 weights take F32 activations).
  cpu::matmul(router, xn, n, rlogits_.data(), pool, mm, isa);
  if (router_bias) {
    for (int64_t i = 0; i < n; ++i) {
      float* row = rlogits_.data() + i * X;
      for (int64_t e = 0; e < X; ++e) row[e] += router_bias[e];
    }
  }
  route_batch(rlogits_.data(), n, X, K, l, pos0, hooks, forced_.data(), rprobs_.data(),
              rids_.data(), rweights_.data(), &pool, cfg_.gating);
  for (int64_t i = 0; i < n * K; ++i) {
    const auto ii = static_cast<size_t>(i);
    items_[ii] = {static_cast<int32_t>(i / K), rids_[ii], rweights_[ii]};
  }
  experts_->run(l, xn, n, std::span<const ExpertItem>(items_.data(), static_cast<size_t>(n * K)),
                out);
}

LayerTrace RoutedMoeCpu::trace(int64_t l, int64_t pos0, int64_t n, const float* l_out) const {
  return layer_trace(cfg_, l, pos0, n, rlogits_.data(), rprobs_.data(), rids_.data(),
                     rweights_.data(), l_out);
}

}  // namespace moe::model
