// One MoE layer's routed experts as the CPU forwards run them: the router in f32, the top k (with
// the force hook), the (token, expert, weight) items and the executor's weighted sum; also the
// layer's routing as a LayerTrace for observe_layer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "coordinator/model/model_arch.h"
#include "experts/expert_executor.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace moe::model {

class RoutedMoeCpu {
 public:
  explicit RoutedMoeCpu(const ModelConfig& cfg) : cfg_(cfg) {}

  void set_executor(std::unique_ptr<ExpertExecutor> experts) { experts_ = std::move(experts); }
  // Grow-only scratch for n tokens: steady-state decoding allocates nothing.
  void reserve(int64_t n_tokens);
  // out[n, n_embd] = the routed experts of layer l on the normed rows xn; `router_bias`
  // (n_expert floats, gpt-oss) is added to the router logits. The config's gating picks the
  // experts and their weights.
  void run(int64_t l, const cpu::WeightMatrix& router, const float* xn, int64_t n, int64_t pos0,
           const ForwardHooks* hooks, float* out, cpu::ThreadPool& pool, cpu::MatmulScratch& mm,
           cpu::Isa isa, const float* router_bias = nullptr);
  // The last run's routing with the layer's output rows l_out.
  LayerTrace trace(int64_t l, int64_t pos0, int64_t n, const float* l_out) const;

 private:
  const ModelConfig& cfg_;
  std::unique_ptr<ExpertExecutor> experts_;
  std::vector<float> rlogits_, rprobs_, rweights_;
  std::vector<int32_t> rids_, forced_;
  std::vector<ExpertItem> items_;
};

}  // namespace moe::model
