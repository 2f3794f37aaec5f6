// gpt-oss's CPU ops against double-precision references on fresh random data (the seed is
// printed on failure): YaRN RoPE angles, the SOFTMAX_WEIGHT router (own and forced choice, one
// thread and the pool), SwiGLU-OAI, the expert executor with per-expert biases and SwiGLU-OAI on
// the tiny model's MXFP4 experts, and attention with per-head sinks and a sliding window through
// model::attention's decode and prompt (block) paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/model/attention.h"
#include "coordinator/model/batch_routing.h"
#include "coordinator/model/kv_cache.h"
#include "experts/cpu_expert_executor.h"
#include "experts/expert_tensors.h"
#include "experts/model_config.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/router.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/testdata.h"

namespace {

using namespace moe::model;

unsigned fresh_seed() { return std::random_device{}(); }

std::string tiny_model() {
  return (moe::test::gptoss_testdata_dir() / "models" / "tiny-gptoss-MXFP4.gguf").string();
}

// ---- YaRN RoPE ----

// YaRN as the paper and llama.cpp define it, in double.
std::vector<double> yarn_reference(int64_t pos, int64_t n_rot, double base, double factor,
                                   int64_t n_ctx_orig, double beta_fast, double beta_slow) {
  const auto corr = [&](double beta) {
    return static_cast<double>(n_rot) *
           std::log(static_cast<double>(n_ctx_orig) / (beta * 2 * std::numbers::pi)) /
           (2 * std::log(base));
  };
  const double low = std::max(0.0, std::floor(corr(beta_fast)));
  const double high = std::min(static_cast<double>(n_rot - 1), std::ceil(corr(beta_slow)));
  const double mscale = 1.0 + 0.1 * std::log(factor);
  std::vector<double> cs(static_cast<size_t>(n_rot));
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const double extrap = static_cast<double>(pos) * std::pow(base, -2.0 * i / n_rot);
    const double ramp =
        1.0 - std::clamp((static_cast<double>(i) - low) / std::max(0.001, high - low), 0.0, 1.0);
    const double theta = extrap / factor * (1 - ramp) + extrap * ramp;
    cs[static_cast<size_t>(2 * i)] = std::cos(theta) * mscale;
    cs[static_cast<size_t>(2 * i + 1)] = std::sin(theta) * mscale;
  }
  return cs;
}

TEST(GptOssOps, YarnAnglesMatchTheReference) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> log_base(std::log(1e4), std::log(1e6));
  std::uniform_real_distribution<double> log_factor(std::log(2.0), std::log(64.0));
  std::uniform_int_distribution<int64_t> pos_d(0, 600), ctx_d(1024, 8192);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n_rot = trial % 2 ? 64 : 128, pos = pos_d(rng), n_ctx = ctx_d(rng);
    const auto base = static_cast<float>(std::exp(log_base(rng)));
    const auto factor = static_cast<float>(std::exp(log_factor(rng)));
    const RopeYarn y = rope_yarn_params(n_rot, base, factor, n_ctx, 32.0f, 1.0f, 1.0f, true);
    std::vector<float> got(static_cast<size_t>(n_rot));
    rope_angles_yarn(pos, n_rot, base, y, got.data());
    const std::vector<double> want = yarn_reference(pos, n_rot, base, factor, n_ctx, 32.0, 1.0);
    for (int64_t i = 0; i < n_rot; ++i) {
      // The angle is built by repeated float multiplication (as ggml): its error grows with the
      // position and the pair index.
      const double tol = 1e-6 + 3e-7 * static_cast<double>((pos + 1) * (i / 2 + 1));
      ASSERT_NEAR(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)], tol)
          << "pos " << pos << " n_rot " << n_rot << " base " << base << " factor " << factor
          << " ctx " << n_ctx << " at " << i;
    }
  }
}

// The tiny model's numbers (base 150000, factor 32 over 4096, 64 dims): the ramp runs from pair 8
// to pair 18 and cos/sin carry 1 + 0.1 ln 32.
TEST(GptOssOps, YarnParametersOfTheTinyModel) {
  const RopeYarn y = rope_yarn_params(64, 150000.0f, 32.0f, 4096, 32.0f, 1.0f, 1.0f, true);
  EXPECT_EQ(y.corr_low, 8.0f);
  EXPECT_EQ(y.corr_high, 18.0f);
  EXPECT_FLOAT_EQ(y.freq_scale, 1.0f / 32);
  EXPECT_NEAR(y.mscale, 1.0 + 0.1 * std::log(32.0), 1e-6);
  // Linear scaling: no ramp, no magnitude.
  const RopeYarn lin = rope_yarn_params(64, 150000.0f, 4.0f, 4096, 32.0f, 1.0f, 1.0f, false);
  EXPECT_EQ(lin.ext_factor, 0.0f);
  EXPECT_EQ(lin.mscale, 1.0f);
  std::vector<float> a(64), b(64);
  rope_angles_yarn(40, 64, 150000.0f, lin, a.data());
  rope_angles(10, 64, 150000.0f, b.data());
  for (int i = 0; i < 64; ++i)
    EXPECT_NEAR(a[static_cast<size_t>(i)], b[static_cast<size_t>(i)], 1e-5);
}

// ---- router ----

TEST(GptOssOps, SoftmaxWeightRoutingMatchesTheReference) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  constexpr int64_t X = 32, K = 4, N = 100;
  std::vector<float> logits(static_cast<size_t>(N * X));
  for (float& v : logits) v = normal(rng);
  std::vector<float> probs(logits.size()), w(static_cast<size_t>(N * K));
  std::vector<int32_t> ids(static_cast<size_t>(N * K));
  for (int64_t t = 0; t < N; ++t) {
    const float* lg = logits.data() + t * X;
    int32_t* id = ids.data() + t * K;
    float* wt = w.data() + t * K;
    route_token_softmax_weight(lg, X, K, nullptr, probs.data() + t * X, id, wt);
    std::vector<int32_t> order(X);
    for (int32_t e = 0; e < X; ++e) order[static_cast<size_t>(e)] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return lg[a] > lg[b]; });
    double mx = lg[order[0]], sum = 0;
    for (int64_t j = 0; j < K; ++j) sum += std::exp(lg[order[static_cast<size_t>(j)]] - mx);
    double psum = 0;
    for (int64_t e = 0; e < X; ++e) psum += std::exp(lg[e] - mx);
    for (int64_t j = 0; j < K; ++j) {
      ASSERT_EQ(id[j], order[static_cast<size_t>(j)]) << "token " << t << " slot " << j;
      EXPECT_NEAR(wt[j], std::exp(lg[id[j]] - mx) / sum, 1e-6);
    }
    for (int64_t e = 0; e < X; ++e) {
      EXPECT_NEAR(probs[static_cast<size_t>(t * X + e)], std::exp(lg[e] - mx) / psum, 1e-6);
    }
    // Forced experts: the softmax over their own logits.
    std::vector<int32_t> forced(order.begin() + 5, order.begin() + 5 + K);
    std::shuffle(forced.begin(), forced.end(), rng);
    std::vector<int32_t> fid(K);
    std::vector<float> fw(K), fp(X);
    route_token_softmax_weight(lg, X, K, forced.data(), fp.data(), fid.data(), fw.data());
    double fmx = -INFINITY, fsum = 0;
    for (int32_t e : forced) fmx = std::max<double>(fmx, lg[e]);
    for (int32_t e : forced) fsum += std::exp(lg[e] - fmx);
    for (int64_t j = 0; j < K; ++j) {
      EXPECT_EQ(fid[static_cast<size_t>(j)], forced[static_cast<size_t>(j)]);
      EXPECT_NEAR(fw[static_cast<size_t>(j)],
                  std::exp(lg[forced[static_cast<size_t>(j)]] - fmx) / fsum, 1e-6);
    }
  }
  // route_batch on the pool (a batch big enough to be spread) routes the same way.
  moe::cpu::ThreadPool pool(2);
  std::vector<float> p2(probs.size()), w2(w.size());
  std::vector<int32_t> i2(ids.size()), scratch(K);
  route_batch(logits.data(), N, X, K, 0, 0, nullptr, scratch.data(), p2.data(), i2.data(),
              w2.data(), &pool, ExpertGating::SoftmaxWeight);
  EXPECT_EQ(i2, ids);
  EXPECT_EQ(w2, w);
  // An out-of-range forced id is an error, not a crash.
  const int32_t bad[K] = {0, 1, 2, 99};
  EXPECT_THROW(
      route_token_softmax_weight(logits.data(), X, K, bad, p2.data(), i2.data(), w2.data()),
      moe::Error);
}

// ---- SwiGLU-OAI ----

double swiglu_oai_ref(double g, double u) {
  const double x = std::min(g, 7.0), y = std::clamp(u, -7.0, 7.0);
  return x / (1.0 + std::exp(-1.702 * x)) * (y + 1.0);
}

TEST(GptOssOps, SwigluOaiMatchesTheReference) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  // Both clamps are reached: |values| up to 12.
  std::uniform_real_distribution<float> val(-12.0f, 12.0f);
  for (int i = 0; i < 100000; ++i) {
    const float g = val(rng), u = val(rng);
    const double want = swiglu_oai_ref(g, u);
    ASSERT_NEAR(swiglu_oai(g, u), want, 1e-6 + 1e-6 * std::fabs(want)) << g << " " << u;
  }
}

// ---- experts with biases and SwiGLU-OAI ----

// One expert's projection in double on its dequantized rows, plus its bias row (may be null).
std::vector<double> project(const ExpertProjection& p, int64_t e, const float* bias,
                            const std::vector<double>& x) {
  std::vector<float> row(static_cast<size_t>(p.n_in));
  std::vector<double> y(static_cast<size_t>(p.n_out));
  for (int64_t o = 0; o < p.n_out; ++o) {
    moe::cpu::dequantize_row(p.type(), p.data(e) + o * p.row_bytes, row.data(), p.n_in);
    double acc = bias ? bias[o] : 0.0;
    for (int64_t i = 0; i < p.n_in; ++i)
      acc += static_cast<double>(row[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
    y[static_cast<size_t>(o)] = acc;
  }
  return y;
}

const float* bias_row(const moe::gguf::TensorInfo* t, int64_t e, int64_t n, bool use) {
  return use ? reinterpret_cast<const float*>(t->data) + e * n : nullptr;
}

// The executor on the tiny model's MXFP4 experts against the double computation with the biases
// and SwiGLU-OAI; the same reference without biases, or with silu, is far off (each part counts).
TEST(GptOssOps, ExpertsWithBiasesMatchTheReference) {
  const auto file = moe::gguf::GgufFile::open(tiny_model());
  const ModelConfig cfg = ModelConfig::from_gguf(file);
  ASSERT_TRUE(cfg.expert_bias);
  ASSERT_EQ(cfg.expert_act, ExpertActivation::SwigluOai);
  const int64_t E = cfg.n_embd, F = cfg.n_ff_exp, X = cfg.n_expert;
  moe::cpu::ThreadPool pool(2);
  const auto experts = cpu_experts_for(file, pool);
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  // Inputs of an RMS-normed row's scale, so that gates reach the clamp at 7 now and then.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (const int64_t n_tokens : {1, 3, 24}) {
    const int64_t layer = n_tokens % cfg.n_layer;
    SCOPED_TRACE(std::to_string(n_tokens) + " tokens, layer " + std::to_string(layer));
    const ExpertLayerTensors t = require_layer_experts(file, cfg, layer);
    std::vector<float> x(static_cast<size_t>(n_tokens * E));
    for (float& v : x) v = normal(rng);
    std::vector<ExpertItem> items;
    std::vector<int32_t> ids(static_cast<size_t>(X));
    for (int32_t e = 0; e < X; ++e) ids[static_cast<size_t>(e)] = e;
    for (int64_t tok = 0; tok < n_tokens; ++tok) {
      std::shuffle(ids.begin(), ids.end(), rng);
      for (int64_t j = 0; j < cfg.n_expert_used; ++j) {
        items.push_back({static_cast<int32_t>(tok), ids[static_cast<size_t>(j)], weight(rng)});
      }
    }
    std::vector<float> got(x.size(), NAN);
    experts->run(layer, x.data(), n_tokens, items, got.data());
    // variant 0: the real thing; 1: no biases; 2: silu(g) * u.
    std::vector<std::vector<double>> want(3, std::vector<double>(x.size(), 0.0));
    for (const ExpertItem& it : items) {
      const std::vector<double> xi(x.begin() + it.token * E, x.begin() + (it.token + 1) * E);
      for (int variant = 0; variant < 3; ++variant) {
        const bool b = variant != 1;
        const auto g = project(t.gate, it.expert, bias_row(t.gate_bias, it.expert, F, b), xi);
        const auto u = project(t.up, it.expert, bias_row(t.up_bias, it.expert, F, b), xi);
        std::vector<double> h(static_cast<size_t>(F));
        for (size_t i = 0; i < h.size(); ++i) {
          h[i] = variant == 2 ? g[i] / (1 + std::exp(-g[i])) * u[i] : swiglu_oai_ref(g[i], u[i]);
        }
        const auto y = project(t.down, it.expert, bias_row(t.down_bias, it.expert, E, b), h);
        for (int64_t d = 0; d < E; ++d) {
          want[static_cast<size_t>(variant)][static_cast<size_t>(it.token * E + d)] +=
              it.weight * y[static_cast<size_t>(d)];
        }
      }
    }
    const auto rel = [&](const std::vector<double>& w) {
      double num = 0, den = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        num += (got[i] - w[i]) * (got[i] - w[i]);
        den += w[i] * w[i];
      }
      return std::sqrt(num / den);
    };
    // MXFP4 weights take Q8_0 activations (as llama.cpp) twice, in and after the GLU: measured
    // 1.1-1.2% of rounding. The tiny model's biases are small (about 4% of the output): leaving
    // them out must show clearly above that.
    const double err = rel(want[0]);
    std::printf("[gptoss-ops] experts %lld tokens: rel %.2e, without biases %.2e, silu %.2e\n",
                static_cast<long long>(n_tokens), err, rel(want[1]), rel(want[2]));
    EXPECT_LE(err, 0.02);
    EXPECT_GE(rel(want[1]), 2 * err) << "biases make no difference";
    EXPECT_GE(rel(want[2]), 0.1) << "SwiGLU-OAI makes no difference";
  }
}

// ---- attention with sinks and a sliding window ----

// Token i (position pos0 + i) of head h in double: softmax over the visible scores and the sink.
std::vector<double> attention_reference(const AttentionShape& s, const std::vector<float>& q,
                                        int64_t n_tokens, int64_t pos0, const std::vector<float>& K,
                                        const std::vector<float>& V) {
  const int64_t hd = s.head_dim_k, group = s.n_head / s.n_head_kv, kw = s.n_head_kv * hd;
  std::vector<double> out(static_cast<size_t>(n_tokens * s.n_head * hd));
  for (int64_t i = 0; i < n_tokens; ++i) {
    const int64_t pos = pos0 + i;
    const int64_t first = s.window > 0 ? std::max<int64_t>(0, pos - s.window + 1) : 0;
    for (int64_t h = 0; h < s.n_head; ++h) {
      const int64_t hk = h / group;
      const float* qi = q.data() + (i * s.n_head + h) * hd;
      std::vector<double> sc;
      double mx = s.sinks ? s.sinks[h] : -INFINITY;
      for (int64_t p = first; p <= pos; ++p) {
        double d = 0;
        for (int64_t j = 0; j < hd; ++j)
          d += static_cast<double>(qi[j]) * K[static_cast<size_t>(p * kw + hk * hd + j)];
        sc.push_back(d * s.scale);
        mx = std::max(mx, sc.back());
      }
      double sum = s.sinks ? std::exp(s.sinks[h] - mx) : 0.0;
      for (double& v : sc) sum += (v = std::exp(v - mx));
      for (int64_t j = 0; j < hd; ++j) {
        double o = 0;
        for (int64_t p = first; p <= pos; ++p) {
          o += sc[static_cast<size_t>(p - first)] * V[static_cast<size_t>(p * kw + hk * hd + j)];
        }
        out[static_cast<size_t>((i * s.n_head + h) * hd + j)] = o / sum;
      }
    }
  }
  return out;
}

TEST(GptOssOps, AttentionWithSinksAndWindowMatchesTheReference) {
  ModelConfig cfg;
  cfg.n_layer = 1;
  cfg.n_head_kv = {2};
  cfg.head_dim_k = cfg.head_dim_v = 64;
  constexpr int64_t kCtx = 160, kHeads = 8, kHd = 64, kKw = 2 * kHd;
  const unsigned seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> sink_d(-3.0f, 6.0f);
  KvCache cache(cfg, kCtx, KvType::F32, KvType::F32);
  std::vector<float> K(static_cast<size_t>(kCtx * kKw)), V(K.size());
  for (float& v : K) v = normal(rng) * 2.0f;  // scores of a few units: sinks compete with them
  for (float& v : V) v = normal(rng);
  for (int64_t p = 0; p < kCtx; ++p) cache.store(0, p, K.data() + p * kKw, V.data() + p * kKw);
  std::vector<float> sinks(kHeads);
  for (float& v : sinks) v = sink_d(rng);
  moe::cpu::ThreadPool pool(2);
  AttentionScratch scratch;
  for (const int64_t window : {int64_t{0}, int64_t{8}, int64_t{100}}) {
    for (const bool with_sinks : {false, true}) {
      if (window == 0 && !with_sinks) continue;  // plain attention: tested elsewhere
      AttentionShape s{kHeads, 2, kHd, kHd, 0.125f};
      s.window = window;
      s.sinks = with_sinks ? sinks.data() : nullptr;
      // Decode (one token), a short batch (decode path), prompt batches (block path) that start
      // at 0 and inside the cache, crossing tiles of 64 positions.
      for (const auto& [pos0, n] :
           {std::pair<int64_t, int64_t>{150, 1}, {5, 20}, {0, 70}, {37, 123}}) {
        SCOPED_TRACE("window " + std::to_string(window) + (with_sinks ? " sinks" : "") + " pos0 " +
                     std::to_string(pos0) + " n " + std::to_string(n));
        std::vector<float> q(static_cast<size_t>(n * kHeads * kHd));
        for (float& v : q) v = normal(rng);
        std::vector<float> got(q.size(), NAN);
        attention(s, q.data(), n, pos0, cache, 0, got.data(), pool, scratch);
        const std::vector<double> want = attention_reference(s, q, n, pos0, K, V);
        double err = 0;
        for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
        EXPECT_LE(err, 2e-5);
      }
    }
  }
}

}  // namespace
