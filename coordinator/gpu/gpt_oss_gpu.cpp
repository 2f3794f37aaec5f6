#include "coordinator/gpu/gpt_oss_gpu.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "coordinator/gpu/attention_gpu.h"
#include "coordinator/gpu/gpu_upload.h"
#include "coordinator/model/kv_shift.h"
#include "experts/tensor_table.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"

namespace moe::gpu {
namespace {

// The rows of one sequence's batch that a layer stores and attends at once: a sliding-window
// ring holds the window of only so many tokens stored together (KvCache::max_step), so a longer
// batch goes through it in steps, as on the CPU; other layers take the whole batch.
int64_t attention_step(const cuda::DeviceKvLayer& kv, int64_t window, int64_t n) {
  return kv.ring > 0 ? std::max<int64_t>(kv.ring - window + 1, 1) : std::max<int64_t>(n, 1);
}

}  // namespace

GptOssGpu::GptOssGpu(const gguf::GgufFile& f, cpu::ThreadPool& pool,
                     std::unique_ptr<model::ExpertExecutor> cpu_experts, const GpuOptions& opt)
    : GpuForward(f, opt) {
  const int64_t E = cfg_.n_embd, hd = cfg_.head_dim_k;
  const int64_t X = cfg_.n_expert;
  if (cfg_.arch != "gpt-oss")
    throw Error("GptOssGpu: the file's architecture is '" + cfg_.arch + "'");
  if (cfg_.n_rot != hd || cfg_.head_dim_v != hd) {
    throw Error(cfg_.arch + ".rope.dimension_count: gpt-oss rotates whole heads of equal K and V " +
                "size (" + std::to_string(hd) + ", " + std::to_string(cfg_.head_dim_v) +
                "), found " + std::to_string(cfg_.n_rot));
  }
  yarn_ = model::rope_params(cfg_);
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const auto vec = [&](const std::string& name, int64_t n) {
      return upload_vector(budget_, model::require_tensor(f, p + name, {n}));
    };
    Layer L;
    L.n_head = cfg_.n_head[static_cast<size_t>(l)];
    L.n_head_kv = cfg_.n_head_kv[static_cast<size_t>(l)];
    L.window = cfg_.is_swa(l) ? cfg_.n_swa : 0;
    const int64_t qw = L.n_head * hd, kw = L.n_head_kv * hd;
    L.attn_norm = vec("attn_norm.weight", E);
    L.post_norm = vec("post_attention_norm.weight", E);
    L.bq = vec("attn_q.bias", qw);
    L.bk = vec("attn_k.bias", kw);
    L.bv = vec("attn_v.bias", kw);
    L.bo = vec("attn_output.bias", E);
    L.sinks = vec("attn_sinks.weight", L.n_head);
    const auto& tq = model::require_tensor(f, p + "attn_q.weight", {E, qw});
    const auto& tk = model::require_tensor(f, p + "attn_k.weight", {E, kw});
    const auto& tv = model::require_tensor(f, p + "attn_v.weight", {E, kw});
    std::vector<const gguf::TensorInfo*> qkv{&tq};
    if (tk.type() == tq.type()) qkv.push_back(&tk);
    if (tk.type() == tq.type() && tv.type() == tq.type()) qkv.push_back(&tv);
    L.wqkv = upload_stacked(budget_, qkv, L.wqkv_buf, VramUse::Weights, p + "attn_q/k/v");
    if (qkv.size() < 2) L.wk = upload_matrix(budget_, tk, L.wk_buf, VramUse::Weights);
    if (qkv.size() < 3) L.wv = upload_matrix(budget_, tv, L.wv_buf, VramUse::Weights);
    L.wo = upload_matrix(budget_, model::require_tensor(f, p + "attn_output.weight", {qw, E}),
                         L.wo_buf, VramUse::Weights);
    L.router = upload_matrix(budget_, model::require_tensor(f, p + "ffn_gate_inp.weight", {E, X}),
                             L.router_buf, VramUse::Weights);
    layers_.push_back(std::move(L));
  }
  // The router's and the experts' biases go to VRAM with the experts (RoutedExpertsGpu).
  place_experts(f, pool, std::move(cpu_experts));
}

void GptOssGpu::reserve_layers(int64_t n) {
  const auto E = static_cast<size_t>(cfg_.n_embd);
  const auto N = static_cast<size_t>(n);
  const auto H = static_cast<size_t>(cfg_.max_n_head());
  const auto HK = static_cast<size_t>(cfg_.max_n_head_kv());
  const auto hd = static_cast<size_t>(cfg_.head_dim_k);
  scratch(d_tmp_, N * E, "scratch tmp");
  scratch(d_qkv_, N * (H + 2 * HK) * hd, "scratch q/k/v");
  scratch(d_attn_, N * H * hd, "scratch attn");
  scratch(d_k_, N * HK * hd, "scratch k");
  scratch(d_v_, N * HK * hd, "scratch v");
  scratch(d_rlogits_, N * static_cast<size_t>(cfg_.n_expert), "scratch router");
}

void GptOssGpu::attention_block(const Layer& L, int64_t l, std::span<const SequenceRows> seqs,
                                int64_t n, const int32_t* device_pos0) {
  const int64_t hd = cfg_.head_dim_k;
  const int64_t qw = L.n_head * hd, kw = L.n_head_kv * hd;
  float* qkv = d_qkv_.as<float>();
  const int64_t S = L.wqkv.n_out;
  cuda::matmul(L.wqkv, xn(), n, qkv, stream_);
  Projections p{qkv, S, qkv + qw, S, qkv + qw + kw, S};
  if (L.wk.data) {
    cuda::matmul(L.wk, xn(), n, d_k_.as<float>(), stream_);
    p.k = d_k_.as<float>();
    p.k_stride = kw;
  }
  if (L.wv.data) {
    cuda::matmul(L.wv, xn(), n, d_v_.as<float>(), stream_);
    p.v = d_v_.as<float>();
    p.v_stride = kw;
  }
  cuda::add_bias(p.q, n, qw, p.q_stride, L.bq.as<float>(), stream_);
  cuda::add_bias(p.k, n, kw, p.k_stride, L.bk.as<float>(), stream_);
  cuda::add_bias(p.v, n, kw, p.v_stride, L.bv.as<float>(), stream_);
  const AttentionOptions ao{&yarn_, {L.window, L.sinks.as<float>()}};
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceRows& s = seqs[i];
    const cuda::DeviceKvLayer& kv = s.seq->kv(l);
    const int64_t step = attention_step(kv, L.window, s.n);
    // A device position is the batch's first: its rows must go in one step (a graphed step of a
    // few tokens always does, the ring holds the window and a batch).
    if (device_pos0 && step < s.n) {
      throw Error("GptOssGpu: a device position for a batch larger than its ring's step");
    }
    for (int64_t r0 = s.row0; r0 < s.row0 + s.n; r0 += step) {
      const int64_t m = std::min(step, s.row0 + s.n - r0);
      const Projections ps{p.q + r0 * p.q_stride, p.q_stride, p.k + r0 * p.k_stride, p.k_stride,
                           p.v + r0 * p.v_stride, p.v_stride};
      // No q/k norms in gpt-oss: RoPE only.
      attend(cfg_, {L.n_head, L.n_head_kv}, kv, ps, nullptr, nullptr, m, s.pos0 + (r0 - s.row0),
             budget_, d_attn_ws_, d_attn_.as<float>() + r0 * qw, stream_,
             device_pos0 ? device_pos0 + i : nullptr, ao);
    }
  }
  cuda::matmul(L.wo, d_attn_.as<float>(), n, d_tmp_.as<float>(), stream_);
  cuda::add_bias(d_tmp_.as<float>(), n, cfg_.n_embd, cfg_.n_embd, L.bo.as<float>(), stream_);
}

void GptOssGpu::enqueue_layers(std::span<const SequenceRows> seqs, const int32_t* device_pos0,
                               const model::ForwardHooks* hooks) {
  if (seqs.empty() || (seqs.size() > 1 && hooks)) {
    throw Error("GptOssGpu: hooks need a batch of one sequence");
  }
  const int64_t E = cfg_.n_embd;
  const float eps = cfg_.rms_eps;
  float* x = this->x();
  float* xn = this->xn();
  const int64_t n = seqs.back().row0 + seqs.back().n;
  const int64_t pos0 = seqs.front().pos0;  // for the hooks (one sequence)
  if (!device_pos0) {
    // Grown once up front: growing it between two sequences or a ring's steps would free a
    // buffer in use.
    size_t ws = 0;
    for (int64_t l = 0; l < cfg_.n_layer; ++l) {
      const Layer& L = layers_[static_cast<size_t>(l)];
      for (const SequenceRows& s : seqs) {
        const int64_t step = attention_step(s.seq->kv(l), L.window, s.n);
        for (int64_t r = 0; r < s.n; r += step) {
          ws = std::max(ws, attention_workspace_bytes(cfg_, {L.n_head, L.n_head_kv},
                                                      std::min(step, s.n - r), s.pos0 + r, false));
        }
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
    attention_block(L, l, seqs, n, device_pos0);
    // post_attention_norm is the norm in front of the MoE block.
    cuda::add_rmsnorm(x, d_tmp_.as<float>(), L.post_norm.as<float>(), xn, n, E, eps, stream_);
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

std::string GptOssGpu::dense_summary() const {
  return "attention (sinks, sliding window), norms, router, output head and KV cache";
}

}  // namespace moe::gpu
