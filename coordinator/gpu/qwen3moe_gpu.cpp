#include "coordinator/gpu/qwen3moe_gpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "coordinator/gpu/attention_gpu.h"
#include "coordinator/gpu/gpu_upload.h"
#include "coordinator/model/batch_routing.h"
#include "experts/tensor_table.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"

namespace moe::gpu {

Qwen3MoeGpu::Qwen3MoeGpu(const gguf::GgufFile& f, cpu::ThreadPool& pool,
                         std::unique_ptr<model::ExpertExecutor> cpu_experts, const GpuOptions& opt)
    : GpuForward(f, opt) {
  const int64_t E = cfg_.n_embd, hk = cfg_.head_dim_k, hv = cfg_.head_dim_v;
  const int64_t X = cfg_.n_expert;
  if (cfg_.n_rot != hk) {
    throw Error(cfg_.arch + ".rope.dimension_count: qwen3moe rotates the whole head (" +
                std::to_string(hk) + "), found " + std::to_string(cfg_.n_rot));
  }

  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const auto vec = [&](const std::string& name, int64_t n) {
      return upload_vector(budget_, model::require_tensor(f, p + name, {n}));
    };
    const auto mat = [&](const std::string& name, int64_t n_in, int64_t n_out, VramBuffer& buf) {
      return upload_matrix(budget_, model::require_tensor(f, p + name, {n_in, n_out}), buf,
                           VramUse::Weights);
    };
    Layer L;
    L.n_head = cfg_.n_head[static_cast<size_t>(l)];
    L.n_head_kv = cfg_.n_head_kv[static_cast<size_t>(l)];
    L.attn_norm = vec("attn_norm.weight", E);
    L.q_norm = vec("attn_q_norm.weight", hk);
    L.k_norm = vec("attn_k_norm.weight", hk);
    L.ffn_norm = vec("ffn_norm.weight", E);
    const auto& tq = model::require_tensor(f, p + "attn_q.weight", {E, L.n_head * hk});
    const auto& tk = model::require_tensor(f, p + "attn_k.weight", {E, L.n_head_kv * hk});
    const auto& tv = model::require_tensor(f, p + "attn_v.weight", {E, L.n_head_kv * hv});
    std::vector<const gguf::TensorInfo*> qkv{&tq};
    if (tk.type() == tq.type()) qkv.push_back(&tk);
    if (tk.type() == tq.type() && tv.type() == tq.type()) qkv.push_back(&tv);
    L.wqkv = upload_stacked(budget_, qkv, L.wqkv_buf, VramUse::Weights, p + "attn_q/k/v");
    if (qkv.size() < 2) L.wk = upload_matrix(budget_, tk, L.wk_buf, VramUse::Weights);
    if (qkv.size() < 3) L.wv = upload_matrix(budget_, tv, L.wv_buf, VramUse::Weights);
    L.wo = mat("attn_output.weight", L.n_head * hv, E, L.wo_buf);
    L.router = mat("ffn_gate_inp.weight", E, X, L.router_buf);
    layers_.push_back(std::move(L));
  }
  place_experts(f, pool, std::move(cpu_experts));
}

void Qwen3MoeGpu::reserve_layers(int64_t n) {
  const auto E = static_cast<size_t>(cfg_.n_embd);
  const auto N = static_cast<size_t>(n);
  const auto H = static_cast<size_t>(cfg_.max_n_head());
  const auto HK = static_cast<size_t>(cfg_.max_n_head_kv());
  const auto hd = static_cast<size_t>(std::max(cfg_.head_dim_k, cfg_.head_dim_v));
  scratch(d_tmp_, N * E, "scratch tmp");
  scratch(d_qkv_, N * (H + 2 * HK) * hd, "scratch q/k/v");
  scratch(d_attn_, N * H * hd, "scratch attn");
  scratch(d_k_, N * HK * hd, "scratch k");
  scratch(d_v_, N * HK * hd, "scratch v");
  scratch(d_rlogits_, N * static_cast<size_t>(cfg_.n_expert), "scratch router");
}

void Qwen3MoeGpu::enqueue_layers(std::span<const SequenceRows> seqs, const int32_t* device_pos0,
                                 const model::ForwardHooks* hooks) {
  if (seqs.empty() || (seqs.size() > 1 && hooks)) {
    throw Error("Qwen3MoeGpu: hooks need a batch of one sequence");
  }
  const int64_t E = cfg_.n_embd;
  const float eps = cfg_.rms_eps;
  float* x = this->x();
  float* xn = this->xn();
  const int64_t hk = cfg_.head_dim_k, hv = cfg_.head_dim_v;
  const int64_t n = seqs.back().row0 + seqs.back().n;
  const int64_t pos0 = seqs.front().pos0;  // for the hooks (one sequence)
  if (!device_pos0 && seqs.size() > 1) {
    // Grown once for every sequence's attention up front: growing it between two sequences
    // would free the old buffer, which waits for the device.
    size_t ws = 0;
    for (const Layer& L : layers_) {
      for (const SequenceRows& s : seqs) {
        ws = std::max(ws,
                      attention_workspace_bytes(cfg_, {L.n_head, L.n_head_kv}, s.n, s.pos0, false));
      }
    }
    if (ws > 0) grow_scratch(budget_, d_attn_ws_, (ws + 3) / 4, "attention scratch");
  }
  std::vector<float> l_out;
  bool normed = false;  // xn holds this layer's attention norm of x already
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    experts_->prefetch(l, n);  // a prefill's expert copies overlap the attention
    if (!normed) cuda::rmsnorm(x, L.attn_norm.as<float>(), xn, n, E, eps, stream_);
    // Row t of the stacked output: q heads, then k and v heads unless they are apart.
    float* qkv = d_qkv_.as<float>();
    const int64_t S = L.wqkv.n_out;
    cuda::matmul(L.wqkv, xn, n, qkv, stream_);
    Projections p{qkv, S, qkv + L.n_head * hk, S, qkv + (L.n_head + L.n_head_kv) * hk, S};
    if (L.wk.data) {
      cuda::matmul(L.wk, xn, n, d_k_.as<float>(), stream_);
      p.k = d_k_.as<float>();
      p.k_stride = L.wk.n_out;
    }
    if (L.wv.data) {
      cuda::matmul(L.wv, xn, n, d_v_.as<float>(), stream_);
      p.v = d_v_.as<float>();
      p.v_stride = L.wv.n_out;
    }
    // Attention per sequence, on its rows of the projections and against its own cache.
    for (size_t i = 0; i < seqs.size(); ++i) {
      const SequenceRows& s = seqs[i];
      const Projections ps{p.q + s.row0 * p.q_stride, p.q_stride,
                           p.k + s.row0 * p.k_stride, p.k_stride,
                           p.v + s.row0 * p.v_stride, p.v_stride};
      attend(cfg_, {L.n_head, L.n_head_kv}, s.seq->kv(l), ps, L.q_norm.as<float>(),
             L.k_norm.as<float>(), s.n, s.pos0, budget_, d_attn_ws_,
             d_attn_.as<float>() + s.row0 * L.n_head * hv, stream_,
             device_pos0 ? device_pos0 + i : nullptr);
    }
    cuda::matmul(L.wo, d_attn_.as<float>(), n, d_tmp_.as<float>(), stream_);
    cuda::add_rmsnorm(x, d_tmp_.as<float>(), L.ffn_norm.as<float>(), xn, n, E, eps, stream_);
    // The next layer's attention norm rides on this layer's expert combine where it can.
    const RoutedExpertsGpu::NormAfter next{
        l + 1 < cfg_.n_layer ? layers_[static_cast<size_t>(l + 1)].attn_norm.as<float>() : nullptr,
        xn, eps};
    normed = experts_->run(l, n, xn, L.router, d_rlogits_.as<float>(), x, pos0, hooks, stream_,
                           next.gains ? &next : nullptr);

    if (hooks && hooks->observe_layer) {
      l_out.resize(static_cast<size_t>(n * E));
      MOE_CUDA_CHECK(
          cudaMemcpyAsync(l_out.data(), x, l_out.size() * 4, cudaMemcpyDeviceToHost, stream_));
      MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      hooks->observe_layer(experts_->trace(l, pos0, n, l_out.data()));
    }
  }
}

std::string Qwen3MoeGpu::dense_summary() const {
  return "attention, norms, router, output head and KV cache";
}

}  // namespace moe::gpu
