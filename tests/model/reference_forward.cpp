#include "tests/model/reference_forward.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "experts/tensor_table.h"
#include "kernels/cpu/dequant.h"

namespace moe::model {
namespace {

using Vec = std::vector<double>;

std::vector<float> dequant_all(const gguf::TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  cpu::dequantize_row(t.type(), t.data, v.data(), t.n_elements());
  return v;
}

// y[o] = sum_i W[o, i] x[i] for W stored as n_out rows of n_in.
Vec matvec(const float* w, const Vec& x, int64_t n_in, int64_t n_out) {
  Vec y(static_cast<size_t>(n_out));
  for (int64_t o = 0; o < n_out; ++o) {
    double s = 0;
    for (int64_t i = 0; i < n_in; ++i)
      s += static_cast<double>(w[o * n_in + i]) * x[static_cast<size_t>(i)];
    y[static_cast<size_t>(o)] = s;
  }
  return y;
}

void rmsnorm(double* x, const float* w, int64_t n, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * scale * w[i];
}

void rope(double* v, int64_t head_dim, int64_t n_rot, double base, int64_t pos) {
  (void)head_dim;
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const double theta = static_cast<double>(pos) *
                         std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
    const double c = std::cos(theta), s = std::sin(theta);
    const double x0 = v[i], x1 = v[i + n_rot / 2];
    v[i] = x0 * c - x1 * s;
    v[i + n_rot / 2] = x0 * s + x1 * c;
  }
}

}  // namespace

ReferenceForward::ReferenceForward(const gguf::GgufFile& f) : cfg_(ModelConfig::from_gguf(f)) {
  const int64_t E = cfg_.n_embd, V = cfg_.n_vocab, hk = cfg_.head_dim_k, hv = cfg_.head_dim_v;
  const int64_t X = cfg_.n_expert, F = cfg_.n_ff_exp;
  tok_embd_ = dequant_all(require_tensor(f, "token_embd.weight", {E, V}));
  output_norm_ = dequant_all(require_tensor(f, "output_norm.weight", {E}));
  const gguf::TensorInfo* out = optional_tensor(f, "output.weight", {E, V});
  output_ = out ? dequant_all(*out) : tok_embd_;
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer L;
    L.n_head = cfg_.n_head[static_cast<size_t>(l)];
    L.n_head_kv = cfg_.n_head_kv[static_cast<size_t>(l)];
    L.attn_norm = dequant_all(require_tensor(f, p + "attn_norm.weight", {E}));
    L.q_norm = dequant_all(require_tensor(f, p + "attn_q_norm.weight", {hk}));
    L.k_norm = dequant_all(require_tensor(f, p + "attn_k_norm.weight", {hk}));
    L.ffn_norm = dequant_all(require_tensor(f, p + "ffn_norm.weight", {E}));
    L.wq = dequant_all(require_tensor(f, p + "attn_q.weight", {E, L.n_head * hk}));
    L.wk = dequant_all(require_tensor(f, p + "attn_k.weight", {E, L.n_head_kv * hk}));
    L.wv = dequant_all(require_tensor(f, p + "attn_v.weight", {E, L.n_head_kv * hv}));
    L.wo = dequant_all(require_tensor(f, p + "attn_output.weight", {L.n_head * hv, E}));
    L.router = dequant_all(require_tensor(f, p + "ffn_gate_inp.weight", {E, X}));
    L.gate = dequant_all(require_tensor(f, p + "ffn_gate_exps.weight", {E, F, X}));
    L.up = dequant_all(require_tensor(f, p + "ffn_up_exps.weight", {E, F, X}));
    L.down = dequant_all(require_tensor(f, p + "ffn_down_exps.weight", {F, E, X}));
    layers_.push_back(std::move(L));
  }
}

ReferenceForward::Result ReferenceForward::run(
    std::span<const int32_t> tokens,
    const std::function<bool(int64_t, int64_t, int32_t*)>& force) const {
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t E = cfg_.n_embd, hk = cfg_.head_dim_k, hv = cfg_.head_dim_v;
  const int64_t X = cfg_.n_expert, K = cfg_.n_expert_used, F = cfg_.n_ff_exp;
  Result res;
  std::vector<Vec> x(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens[static_cast<size_t>(t)];
    if (id < 0 || id >= cfg_.n_vocab) throw Error("reference: token out of range");
    x[static_cast<size_t>(t)].assign(tok_embd_.begin() + id * E, tok_embd_.begin() + (id + 1) * E);
  }
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    const int64_t H = L.n_head, HK = L.n_head_kv;
    // Q, K, V of every position (no cache: recomputed from scratch).
    std::vector<Vec> q(static_cast<size_t>(n)), k(static_cast<size_t>(n)),
        v(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      Vec h = x[static_cast<size_t>(t)];
      rmsnorm(h.data(), L.attn_norm.data(), E, cfg_.rms_eps);
      q[static_cast<size_t>(t)] = matvec(L.wq.data(), h, E, H * hk);
      k[static_cast<size_t>(t)] = matvec(L.wk.data(), h, E, HK * hk);
      v[static_cast<size_t>(t)] = matvec(L.wv.data(), h, E, HK * hv);
      for (int64_t hh = 0; hh < H; ++hh) {
        rmsnorm(q[static_cast<size_t>(t)].data() + hh * hk, L.q_norm.data(), hk, cfg_.rms_eps);
        rope(q[static_cast<size_t>(t)].data() + hh * hk, hk, cfg_.n_rot, cfg_.rope_freq_base, t);
      }
      for (int64_t hh = 0; hh < HK; ++hh) {
        rmsnorm(k[static_cast<size_t>(t)].data() + hh * hk, L.k_norm.data(), hk, cfg_.rms_eps);
        rope(k[static_cast<size_t>(t)].data() + hh * hk, hk, cfg_.n_rot, cfg_.rope_freq_base, t);
      }
    }
    std::vector<int32_t> chosen(static_cast<size_t>(n * K));
    for (int64_t t = 0; t < n; ++t) {
      // Attention: causal, GQA head mapping h -> h / (H / HK).
      Vec att(static_cast<size_t>(H * hv), 0.0);
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t kh = hh / (H / HK);
        Vec sc(static_cast<size_t>(t + 1));
        double mx = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int64_t d = 0; d < hk; ++d) {
            s += q[static_cast<size_t>(t)][static_cast<size_t>(hh * hk + d)] *
                 k[static_cast<size_t>(j)][static_cast<size_t>(kh * hk + d)];
          }
          sc[static_cast<size_t>(j)] = s / std::sqrt(static_cast<double>(hk));
          mx = std::max(mx, sc[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (auto& s : sc) sum += (s = std::exp(s - mx));
        for (int64_t j = 0; j <= t; ++j) {
          for (int64_t d = 0; d < hv; ++d) {
            att[static_cast<size_t>(hh * hv + d)] +=
                sc[static_cast<size_t>(j)] / sum *
                v[static_cast<size_t>(j)][static_cast<size_t>(kh * hv + d)];
          }
        }
      }
      const Vec o = matvec(L.wo.data(), att, H * hv, E);
      Vec& xt = x[static_cast<size_t>(t)];
      for (int64_t i = 0; i < E; ++i) xt[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
    }
    // MoE, after attention of every position (attention reads only the pre-layer K/V above).
    for (int64_t t = 0; t < n; ++t) {
      Vec& xt = x[static_cast<size_t>(t)];
      Vec h = xt;
      rmsnorm(h.data(), L.ffn_norm.data(), E, cfg_.rms_eps);
      Vec logit = matvec(L.router.data(), h, E, X);
      const double mx = *std::max_element(logit.begin(), logit.end());
      double sum = 0;
      for (auto& z : logit) sum += (z = std::exp(z - mx));
      for (auto& z : logit) z /= sum;  // now probabilities
      int32_t* ids = chosen.data() + t * K;
      if (!(force && force(l, t, ids))) {
        std::vector<int32_t> order(static_cast<size_t>(X));
        for (int64_t e = 0; e < X; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
          return logit[static_cast<size_t>(a)] > logit[static_cast<size_t>(b)];
        });
        std::copy(order.begin(), order.begin() + K, ids);
      }
      double wsum = 0;
      for (int64_t j = 0; j < K; ++j) wsum += logit[static_cast<size_t>(ids[j])];
      Vec acc(static_cast<size_t>(E), 0.0);
      for (int64_t j = 0; j < K; ++j) {
        const int64_t e = ids[j];
        const double w = logit[static_cast<size_t>(e)] / std::max(wsum, 6.103515625e-5);
        const Vec g = matvec(L.gate.data() + e * F * E, h, E, F);
        const Vec u = matvec(L.up.data() + e * F * E, h, E, F);
        Vec a(static_cast<size_t>(F));
        for (int64_t i = 0; i < F; ++i) {
          const double gv = g[static_cast<size_t>(i)];
          a[static_cast<size_t>(i)] = gv / (1.0 + std::exp(-gv)) * u[static_cast<size_t>(i)];
        }
        const Vec d = matvec(L.down.data() + e * E * F, a, F, E);
        for (int64_t i = 0; i < E; ++i)
          acc[static_cast<size_t>(i)] += w * d[static_cast<size_t>(i)];
      }
      for (int64_t i = 0; i < E; ++i) xt[static_cast<size_t>(i)] += acc[static_cast<size_t>(i)];
    }
    res.experts.push_back(std::move(chosen));
  }
  res.logits.resize(static_cast<size_t>(n * cfg_.n_vocab));
  for (int64_t t = 0; t < n; ++t) {
    Vec h = x[static_cast<size_t>(t)];
    rmsnorm(h.data(), output_norm_.data(), E, cfg_.rms_eps);
    const Vec y = matvec(output_.data(), h, E, cfg_.n_vocab);
    std::copy(y.begin(), y.end(), res.logits.begin() + t * cfg_.n_vocab);
  }
  return res;
}

}  // namespace moe::model
