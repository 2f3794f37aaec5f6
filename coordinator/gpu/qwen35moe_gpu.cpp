#include "coordinator/gpu/qwen35moe_gpu.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "coordinator/gpu/attention_gpu.h"
#include "coordinator/gpu/gpu_upload.h"
#include "coordinator/model/batch_routing.h"
#include "experts/tensor_table.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/delta_net.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/qwen35_ops.h"
#include "kernels/cuda/rmsnorm.h"

namespace moe::gpu {
namespace {

using model::ModelConfig;

// IMROPE gives text tokens (all position components equal) plain NEOX angles when every rotated
// pair belongs to the t, h or w sections; the GPU path relies on that (the CPU path computes the
// sections in general). At position 1 every NEOX angle is non-zero, so the two tables differ
// exactly where a pair takes its angle from the e section (0 for text).
void require_text_imrope(const ModelConfig& c) {
  const auto& s = c.rope_sections;
  std::string sections;  // "[11, 11, 10, 0]"
  for (size_t j = 0; j < s.size(); ++j) sections += (j ? ", " : "[") + std::to_string(s[j]);
  sections += "]";
  if (s[0] + s[1] + s[2] + s[3] <= 0) {
    throw Error(c.arch + ".rope.dimension_sections " + sections + ": no section has a size");
  }
  std::vector<float> imrope(static_cast<size_t>(c.n_rot)), neox(imrope.size());
  model::rope_angles_imrope(1, c.n_rot, c.rope_freq_base, s.data(), imrope.data());
  model::rope_angles(1, c.n_rot, c.rope_freq_base, neox.data());
  for (int64_t i = 0; i < c.n_rot / 2; ++i) {
    if (imrope[static_cast<size_t>(2 * i)] != neox[static_cast<size_t>(2 * i)] ||
        imrope[static_cast<size_t>(2 * i + 1)] != neox[static_cast<size_t>(2 * i + 1)]) {
      throw Error(c.arch + ".rope.dimension_sections " + sections + ": rotated pair " +
                  std::to_string(i) +
                  " is not in a t/h/w section, which the GPU path does not support (use -ngl 0)");
    }
  }
}

}  // namespace

Qwen35MoeGpu::Qwen35MoeGpu(const gguf::GgufFile& f, cpu::ThreadPool& pool,
                           std::unique_ptr<model::ExpertExecutor> cpu_experts,
                           const GpuOptions& opt)
    : GpuForward(f, opt) {
  if (cfg_.arch != "qwen35moe") {
    throw Error("Qwen35MoeGpu: the file's architecture is '" + cfg_.arch + "'");
  }
  if (cfg_.head_dim_k != cfg_.head_dim_v) {
    throw Error(cfg_.arch + ": the per-head output gate needs key and value heads of one size (" +
                std::to_string(cfg_.head_dim_k) + " vs " + std::to_string(cfg_.head_dim_v) + ")");
  }
  require_text_imrope(cfg_);
  layers_.resize(static_cast<size_t>(cfg_.n_layer));
  for (int64_t l = 0; l < cfg_.n_layer; ++l) load_layer(f, l, layers_[static_cast<size_t>(l)]);
  place_experts(f, pool, std::move(cpu_experts));
}

Qwen35MoeGpu::Matrix Qwen35MoeGpu::matrix(const gguf::TensorInfo& t) {
  Matrix m;
  m.m = upload_matrix(budget_, t, m.buf, VramUse::Weights);
  return m;
}

void Qwen35MoeGpu::load_layer(const gguf::GgufFile& f, int64_t l, Layer& L) {
  const int64_t E = cfg_.n_embd, hk = cfg_.head_dim_k, hv = cfg_.head_dim_v;
  const int64_t X = cfg_.n_expert, FS = cfg_.n_ff_shexp;
  const int64_t C = cfg_.ssm_conv_channels(), KC = cfg_.ssm_conv_kernel;
  const int64_t NV = cfg_.ssm_n_v_heads, DV = cfg_.ssm_head_v(), DI = cfg_.ssm_inner;
  const std::string p = "blk." + std::to_string(l) + ".";
  const auto t = [&](const std::string& name,
                     const std::vector<int64_t>& ne) -> const gguf::TensorInfo& {
    return model::require_tensor(f, p + name, ne);
  };
  const auto vec = [&](const std::string& name, int64_t n) {
    return upload_vector(budget_, t(name, {n}));
  };
  L.recurrent = cfg_.is_recurrent(l);
  L.attn_norm = vec("attn_norm.weight", E);
  L.post_norm = vec("post_attention_norm.weight", E);
  if (L.recurrent) {
    L.wqkv = matrix(t("attn_qkv.weight", {E, C}));
    L.wz = matrix(t("attn_gate.weight", {E, DI}));
    L.wbeta = matrix(t("ssm_beta.weight", {E, NV}));
    L.walpha = matrix(t("ssm_alpha.weight", {E, NV}));
    L.wssm_out = matrix(t("ssm_out.weight", {DI, E}));
    // The file stores [channels][taps]; the kernel reads tap-major rows, as the CPU's.
    const std::vector<float> conv = model::vector_f32(t("ssm_conv1d.weight", {KC, C}));
    std::vector<float> tap_major(conv.size());
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t i = 0; i < KC; ++i) {
        tap_major[static_cast<size_t>(i * C + c)] = conv[static_cast<size_t>(c * KC + i)];
      }
    }
    L.conv_w = upload_floats(budget_, tap_major.data(), tap_major.size(), p + "ssm_conv1d.weight");
    L.dt_bias = vec("ssm_dt.bias", NV);
    L.ssm_a = vec("ssm_a", NV);
    L.ssm_norm = vec("ssm_norm.weight", DV);
  } else {
    L.n_head = cfg_.n_head[static_cast<size_t>(l)];
    L.n_head_kv = cfg_.n_head_kv[static_cast<size_t>(l)];
    // Per head: head_dim query rows, then head_dim output-gate rows.
    L.wq = matrix(t("attn_q.weight", {E, L.n_head * hk * 2}));
    L.wk = matrix(t("attn_k.weight", {E, L.n_head_kv * hk}));
    L.wv = matrix(t("attn_v.weight", {E, L.n_head_kv * hv}));
    L.wo = matrix(t("attn_output.weight", {L.n_head * hv, E}));
    L.q_norm = vec("attn_q_norm.weight", hk);
    L.k_norm = vec("attn_k_norm.weight", hk);
  }
  L.router = matrix(t("ffn_gate_inp.weight", {E, X}));
  L.sh_gate_inp = matrix(t("ffn_gate_inp_shexp.weight", {E}));
  L.sh_gate = matrix(t("ffn_gate_shexp.weight", {E, FS}));
  L.sh_up = matrix(t("ffn_up_shexp.weight", {E, FS}));
  L.sh_down = matrix(t("ffn_down_shexp.weight", {FS, E}));
}

void Qwen35MoeGpu::reserve_layers(int64_t n) {
  const auto N = static_cast<size_t>(n);
  const auto E = static_cast<size_t>(cfg_.n_embd);
  const auto C = static_cast<size_t>(cfg_.ssm_conv_channels());
  const auto DI = static_cast<size_t>(cfg_.ssm_inner);
  const auto NV = static_cast<size_t>(cfg_.ssm_n_v_heads);
  const auto H = static_cast<size_t>(cfg_.max_n_head());
  const auto HK = static_cast<size_t>(cfg_.max_n_head_kv());
  const auto hd = static_cast<size_t>(std::max(cfg_.head_dim_k, cfg_.head_dim_v));
  const auto FS = static_cast<size_t>(cfg_.n_ff_shexp);
  for (auto* b : {&d_mix_, &d_moe_, &d_sh_}) scratch(*b, N * E, "scratch rows");
  scratch(d_rlogits_, N * static_cast<size_t>(cfg_.n_expert), "scratch router");
  scratch(d_qkv_, N * C, "scratch qkv");
  scratch(d_conv_, N * C, "scratch conv");
  scratch(d_z_, N * DI, "scratch z");
  scratch(d_ssm_o_, N * DI, "scratch DeltaNet out");
  scratch(d_beta_, N * NV, "scratch beta");
  scratch(d_gate_, N * NV, "scratch decay");
  scratch(d_qg_, N * H * hd * 2, "scratch q+gate");
  for (auto* b : {&d_q_, &d_og_, &d_attn_}) scratch(*b, N * H * hd, "scratch heads");
  scratch(d_k_, N * HK * hd, "scratch k");
  scratch(d_v_, N * HK * hd, "scratch v");
  scratch(d_sg_, N * FS, "scratch shared gate");
  scratch(d_su_, N * FS, "scratch shared up");
  scratch(d_ss_, N, "scratch shared scale");
}

void Qwen35MoeGpu::delta_net_layer(const Layer& L, int64_t l, int64_t n,
                                   std::span<const SequenceRows> seqs) {
  const int64_t C = cfg_.ssm_conv_channels(), NK = cfg_.ssm_n_k_heads, NV = cfg_.ssm_n_v_heads;
  const int64_t DK = cfg_.ssm_head_k, DV = cfg_.ssm_head_v();
  const float* xn = this->xn();
  float* qkv = d_qkv_.as<float>();
  float* conv = d_conv_.as<float>();
  float* z = d_z_.as<float>();
  float* beta = d_beta_.as<float>();
  float* g = d_gate_.as<float>();
  float* o = d_ssm_o_.as<float>();
  cuda::matmul(L.wqkv.m, xn, n, qkv, stream_);
  cuda::matmul(L.wz.m, xn, n, z, stream_);
  cuda::matmul(L.wbeta.m, xn, n, beta, stream_);
  cuda::matmul(L.walpha.m, xn, n, g, stream_);
  cuda::delta_net_gates(beta, g, L.dt_bias.as<float>(), L.ssm_a.as<float>(), n, NV, stream_);
  // The conv window continues each sequence's own inputs.
  for (const SequenceRows& s : seqs) {
    const GpuSequenceStates::RecurrentView st = s.seq->recurrent(l);
    cuda::causal_conv1d({C, cfg_.ssm_conv_kernel}, qkv + s.row0 * C, s.n, L.conv_w.as<float>(),
                        st.conv_in, st.conv_out, conv + s.row0 * C, /*silu=*/true, stream_);
  }
  // q and k heads sit side by side at the start of every conv row (per token: all rows at once).
  cuda::l2norm_heads(conv, n, C, 2 * NK, DK, cfg_.rms_eps, stream_);
  for (const SequenceRows& s : seqs) {
    const GpuSequenceStates::RecurrentView st = s.seq->recurrent(l);
    const float* c0 = conv + s.row0 * C;
    cuda::gated_delta_net({NK, NV, DK, DV}, c0, c0 + NK * DK, c0 + 2 * NK * DK, C, g + s.row0 * NV,
                          beta + s.row0 * NV, s.n, st.ssm_in, st.ssm_out, o + s.row0 * NV * DV,
                          stream_);
  }
  cuda::rmsnorm_gated(o, L.ssm_norm.as<float>(), z, o, n * NV, DV, cfg_.rms_eps, stream_);
  cuda::matmul(L.wssm_out.m, o, n, d_mix_.as<float>(), stream_);
}

void Qwen35MoeGpu::attention_layer(const Layer& L, int64_t l, int64_t n,
                                   std::span<const SequenceRows> seqs, const int32_t* device_pos0) {
  const int64_t hk = cfg_.head_dim_k;
  const float* xn = this->xn();
  float* q = d_q_.as<float>();
  float* og = d_og_.as<float>();
  float* attn = d_attn_.as<float>();
  cuda::matmul(L.wq.m, xn, n, d_qg_.as<float>(), stream_);
  cuda::matmul(L.wk.m, xn, n, d_k_.as<float>(), stream_);
  cuda::matmul(L.wv.m, xn, n, d_v_.as<float>(), stream_);
  cuda::split_query_gate(d_qg_.as<float>(), q, og, n, L.n_head, hk, stream_);
  const int64_t H = L.n_head, HK = L.n_head_kv, hv = cfg_.head_dim_v;
  // Per sequence, on its rows and against its own cache.
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceRows& s = seqs[i];
    attend(cfg_, {H, HK}, s.seq->kv(l),
           {q + s.row0 * H * hk, H * hk, d_k_.as<float>() + s.row0 * HK * hk, HK * hk,
            d_v_.as<float>() + s.row0 * HK * hv, HK * hv},
           L.q_norm.as<float>(), L.k_norm.as<float>(), s.n, s.pos0, budget_, d_attn_ws_,
           attn + s.row0 * H * hv, stream_, device_pos0 ? device_pos0 + i : nullptr);
  }
  cuda::mul_sigmoid(attn, og, n * L.n_head * hk, stream_);
  cuda::matmul(L.wo.m, attn, n, d_mix_.as<float>(), stream_);
}

void Qwen35MoeGpu::ffn(const Layer& L, int64_t l, int64_t n, int64_t pos0,
                       const model::ForwardHooks* hooks) {
  const int64_t E = cfg_.n_embd;
  const float* xn = this->xn();
  float* x = this->x();
  float* moe = d_moe_.as<float>();
  // The shared expert on its own stream, so the router's logits (and a split layer's host
  // round trip) do not wait for it.
  const cudaStream_t side = shared_stream_.get();
  MOE_CUDA_CHECK(cudaEventRecord(xn_ready_.get(), stream_));
  MOE_CUDA_CHECK(cudaStreamWaitEvent(side, xn_ready_.get(), 0));
  cuda::matmul(L.sh_gate.m, xn, n, d_sg_.as<float>(), side);
  cuda::matmul(L.sh_up.m, xn, n, d_su_.as<float>(), side);
  cuda::swiglu(d_sg_.as<float>(), d_su_.as<float>(), d_sg_.as<float>(), n * cfg_.n_ff_shexp, side);
  cuda::matmul(L.sh_down.m, d_sg_.as<float>(), n, d_sh_.as<float>(), side);
  cuda::matmul(L.sh_gate_inp.m, xn, n, d_ss_.as<float>(), side);
  MOE_CUDA_CHECK(cudaEventRecord(shared_done_.get(), side));
  try {
    MOE_CUDA_CHECK(cudaMemsetAsync(moe, 0, static_cast<size_t>(n * E) * sizeof(float), stream_));
    experts_->run(l, n, xn, L.router.m, d_rlogits_.as<float>(), moe, pos0, hooks, stream_);
  } catch (...) {
    // Joined on the error path too: a failed forward's synchronisation of the main stream then
    // also covers the shared expert's kernels (scratch may be reallocated after it).
    (void)cudaStreamWaitEvent(stream_, shared_done_.get(), 0);
    throw;
  }
  MOE_CUDA_CHECK(cudaStreamWaitEvent(stream_, shared_done_.get(), 0));
  const bool observe = hooks && hooks->observe_layer;
  if (observe) {
    h_trace_.resize(static_cast<size_t>(n * E));
    MOE_CUDA_CHECK(
        cudaMemcpyAsync(h_trace_.data(), x, h_trace_.size() * 4, cudaMemcpyDeviceToHost, stream_));
  }
  cuda::shared_expert_combine(moe, d_sh_.as<float>(), d_ss_.as<float>(), x, x, n, E, stream_);
  if (observe) {
    l_out_.resize(static_cast<size_t>(n * E));
    MOE_CUDA_CHECK(
        cudaMemcpyAsync(l_out_.data(), x, l_out_.size() * 4, cudaMemcpyDeviceToHost, stream_));
    MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    model::LayerTrace tr = experts_->trace(l, pos0, n, l_out_.data());
    tr.attn_residual = h_trace_.data();
    hooks->observe_layer(tr);
  }
}

void Qwen35MoeGpu::enqueue_layers(std::span<const SequenceRows> seqs, const int32_t* device_pos0,
                                  const model::ForwardHooks* hooks) {
  if (seqs.empty() || (seqs.size() > 1 && hooks)) {
    throw Error("Qwen35MoeGpu: hooks need a batch of one sequence");
  }
  const int64_t n = seqs.back().row0 + seqs.back().n;
  const int64_t pos0 = seqs.front().pos0;  // for the hooks (one sequence)
  if (!device_pos0 && seqs.size() > 1) {
    // Grown once for every sequence's attention up front (a graph's recording grew it before): growing it between two sequences
    // would free the old buffer, which waits for the device.
    size_t ws = 0;
    for (const Layer& L : layers_) {
      if (L.recurrent) continue;
      for (const SequenceRows& s : seqs) {
        ws = std::max(ws,
                      attention_workspace_bytes(cfg_, {L.n_head, L.n_head_kv}, s.n, s.pos0, false));
      }
    }
    if (ws > 0) grow_scratch(budget_, d_attn_ws_, (ws + 3) / 4, "attention scratch");
  }
  const int64_t E = cfg_.n_embd;
  const float eps = cfg_.rms_eps;
  float* x = this->x();
  float* xn = this->xn();
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    experts_->prefetch(l, n);  // a prefill's expert copies overlap the mixer
    cuda::rmsnorm(x, L.attn_norm.as<float>(), xn, n, E, eps, stream_);
    if (L.recurrent) {
      delta_net_layer(L, l, n, seqs);
    } else {
      attention_layer(L, l, n, seqs, device_pos0);
    }
    cuda::add_inplace(x, d_mix_.as<float>(), n * E, stream_);  // x is now the residual h
    cuda::rmsnorm(x, L.post_norm.as<float>(), xn, n, E, eps, stream_);
    ffn(L, l, n, pos0, hooks);
  }
}

std::string Qwen35MoeGpu::dense_summary() const {
  return "DeltaNet and attention layers, their state, norms, router, shared expert and output head";
}

}  // namespace moe::gpu
