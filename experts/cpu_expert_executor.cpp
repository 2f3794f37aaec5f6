#include "experts/cpu_expert_executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "experts/model_config.h"
#include "experts/tensor_table.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/cpu_features.h"

namespace moe::model {
namespace {

// Below this many weighted elements the final sum stays on the calling thread.
constexpr int64_t kParallelSumElems = 1 << 16;

template <typename T>
void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

void add_bias(float* y, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += b[i];
}

}  // namespace

CpuExpertExecutor::CpuExpertExecutor(std::vector<ExpertLayerTensors> layers, int64_t n_embd,
                                     int64_t n_ff, int64_t n_expert, cpu::ThreadPool& pool,
                                     cpu::Isa isa, ExpertActivation act)
    : n_embd_(n_embd), n_ff_(n_ff), n_expert_(n_expert), act_(act), pool_(pool), isa_(isa) {
  layers_.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const ExpertLayerTensors& t = layers[l];
    if (!t.gate.tensor || !t.up.tensor || !t.down.tensor) {
      throw Error("expert executor: layer tensors missing");
    }
    layers_[l].resize(static_cast<size_t>(n_expert));
    // Biases are F32 [n_out, n_expert] (require_expert_biases): expert e's row, read in place.
    const auto bias = [](const gguf::TensorInfo* b, int64_t e, int64_t n) -> const float* {
      return b ? reinterpret_cast<const float*>(b->data) + e * n : nullptr;
    };
    for (int64_t e = 0; e < n_expert; ++e) {
      layers_[l][static_cast<size_t>(e)] = {t.gate.matrix(e),         t.up.matrix(e),
                                            t.down.matrix(e),         bias(t.gate_bias, e, n_ff),
                                            bias(t.up_bias, e, n_ff), bias(t.down_bias, e, n_embd)};
    }
  }
  count_.resize(static_cast<size_t>(n_expert));
  offset_.resize(static_cast<size_t>(n_expert) + 1);
}

void CpuExpertExecutor::run(int64_t layer, const float* x, int64_t n_tokens,
                            std::span<const ExpertItem> items, float* out) {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) {
    throw Error("expert executor: layer " + std::to_string(layer) + " out of range");
  }
  const auto& experts = layers_[static_cast<size_t>(layer)];
  const int64_t n_items = static_cast<int64_t>(items.size());
  for (const ExpertItem& it : items) {
    if (it.expert < 0 || it.expert >= n_expert_ || it.token < 0 || it.token >= n_tokens) {
      throw Error("expert executor: item (token " + std::to_string(it.token) + ", expert " +
                  std::to_string(it.expert) + ") out of range");
    }
  }
  // Counting sort of the items by expert (stable), so each expert sees all its tokens at once.
  std::fill(count_.begin(), count_.end(), 0);
  for (const ExpertItem& it : items) ++count_[static_cast<size_t>(it.expert)];
  offset_[0] = 0;
  for (int64_t e = 0; e < n_expert_; ++e) {
    offset_[static_cast<size_t>(e) + 1] =
        offset_[static_cast<size_t>(e)] + count_[static_cast<size_t>(e)];
  }
  grow(order_, static_cast<size_t>(n_items));
  std::fill(count_.begin(), count_.end(), 0);
  for (int64_t i = 0; i < n_items; ++i) {
    const auto e = static_cast<size_t>(items[static_cast<size_t>(i)].expert);
    order_[static_cast<size_t>(offset_[e] + count_[e]++)] = static_cast<int32_t>(i);
  }
  grow(item_out_, static_cast<size_t>(n_items * n_embd_));

  run_batched(experts, x, items);
  // Weighted sum in item order, independent of how the items were grouped; a prefill batch's
  // sum is spread over the pool by columns, which keeps that order for every element.
  std::fill(out, out + n_tokens * n_embd_, 0.0f);
  const int64_t n_chunks = n_items * n_embd_ >= kParallelSumElems ? pool_.size() : 1;
  const int64_t chunk = (n_embd_ + n_chunks - 1) / n_chunks;
  auto sum_columns = [&](int64_t c, int) {
    const int64_t d0 = c * chunk, d1 = std::min(n_embd_, d0 + chunk);
    for (int64_t i = 0; i < n_items; ++i) {
      const ExpertItem& it = items[static_cast<size_t>(i)];
      float* o = out + it.token * n_embd_;
      const float* y = item_out_.data() + i * n_embd_;
      for (int64_t d = d0; d < d1; ++d) o[d] += it.weight * y[d];
    }
  };
  if (n_chunks == 1) {
    sum_columns(0, 0);
  } else {
    pool_.parallel_for(n_chunks, sum_columns);
  }
}

void CpuExpertExecutor::glu_rows(const std::vector<ExpertWeights>& experts, float* g, float* u,
                                 int64_t rows) {
  // Serial, this took 40 us of a 16-thread decode layer (8 rows of 768 exponentials).
  pool_.parallel_for(rows, [&](int64_t r, int) {
    float* gr = g + r * n_ff_;
    float* ur = u + r * n_ff_;
    const ExpertWeights& w = experts[static_cast<size_t>(row_expert_[static_cast<size_t>(r)])];
    if (w.gate_b) add_bias(gr, w.gate_b, n_ff_);
    if (w.up_b) add_bias(ur, w.up_b, n_ff_);
    if (act_ == ExpertActivation::SwigluOai) {
      for (int64_t i = 0; i < n_ff_; ++i) gr[i] = swiglu_oai(gr[i], ur[i]);
    } else {
      for (int64_t i = 0; i < n_ff_; ++i) {
        const float gv = gr[i];
        gr[i] = gv / (1.0f + std::exp(-gv)) * ur[i];
      }
    }
  });
}

void CpuExpertExecutor::run_batched(const std::vector<ExpertWeights>& experts, const float* x,
                                    std::span<const ExpertItem> items) {
  // All gate/up products go out in one dispatch of the pool and all down products in a second,
  // instead of three per expert: a decode layer's experts are GEMVs too small to wake every
  // thread for, and a prefill share's experts GEMMs of a few GEMM blocks each.
  const auto n_items = static_cast<int64_t>(items.size());
  grow(xg_, static_cast<size_t>(n_items * n_embd_));
  grow(g_, static_cast<size_t>(n_items * n_ff_));
  grow(u_, static_cast<size_t>(n_items * n_ff_));
  grow(row_expert_, static_cast<size_t>(n_items));
  jobs_.clear();
  for (int64_t e = 0; e < n_expert_; ++e) {
    const int64_t begin = offset_[static_cast<size_t>(e)];
    const int64_t cnt = offset_[static_cast<size_t>(e) + 1] - begin;
    if (cnt == 0) continue;
    std::fill_n(row_expert_.begin() + begin, cnt, static_cast<int32_t>(e));
    // An expert with one token reads that token's row in place, so every expert of a decode
    // token has the same input and matmul_batch converts it once; more rows are gathered.
    const float* xe =
        x + items[static_cast<size_t>(order_[static_cast<size_t>(begin)])].token * n_embd_;
    if (cnt > 1) {
      for (int64_t r = begin; r < begin + cnt; ++r) {
        const ExpertItem& it = items[static_cast<size_t>(order_[static_cast<size_t>(r)])];
        std::memcpy(xg_.data() + r * n_embd_, x + it.token * n_embd_,
                    static_cast<size_t>(n_embd_) * sizeof(float));
      }
      xe = xg_.data() + begin * n_embd_;
    }
    const ExpertWeights& w = experts[static_cast<size_t>(e)];
    jobs_.push_back({w.gate, xe, cnt, g_.data() + begin * n_ff_});
    jobs_.push_back({w.up, xe, cnt, u_.data() + begin * n_ff_});
  }
  cpu::matmul_batch(jobs_, pool_, mm_scratch_, isa_);
  glu_rows(experts, g_.data(), u_.data(), n_items);
  jobs_.clear();
  for (int64_t e = 0; e < n_expert_; ++e) {
    const int64_t begin = offset_[static_cast<size_t>(e)];
    const int64_t cnt = offset_[static_cast<size_t>(e) + 1] - begin;
    if (cnt == 0) continue;
    // The down projections land in xg_ (free again), row r for sorted item r.
    jobs_.push_back({experts[static_cast<size_t>(e)].down, g_.data() + begin * n_ff_, cnt,
                     xg_.data() + begin * n_embd_});
  }
  cpu::matmul_batch(jobs_, pool_, mm_scratch_, isa_);
  for (int64_t r = 0; r < n_items; ++r) {
    float* y = item_out_.data() + order_[static_cast<size_t>(r)] * n_embd_;
    std::memcpy(y, xg_.data() + r * n_embd_, static_cast<size_t>(n_embd_) * sizeof(float));
    const float* b = experts[static_cast<size_t>(row_expert_[static_cast<size_t>(r)])].down_b;
    if (b) add_bias(y, b, n_embd_);
  }
}

std::unique_ptr<CpuExpertExecutor> cpu_experts_for(const gguf::GgufFile& f, cpu::ThreadPool& pool) {
  const ModelConfig cfg = ModelConfig::from_gguf(f);
  std::vector<ExpertLayerTensors> layers;
  for (int64_t l = 0; l < cfg.n_layer; ++l) layers.push_back(require_layer_experts(f, cfg, l));
  return std::make_unique<CpuExpertExecutor>(std::move(layers), cfg.n_embd, cfg.n_ff_exp,
                                             cfg.n_expert, pool, cpu::best_isa(), cfg.expert_act);
}

}  // namespace moe::model
