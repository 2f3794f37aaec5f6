#include "coordinator/tools/expert_prediction.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "common/error.h"
#include "experts/tensor_table.h"

namespace moe::tools {
namespace {

struct Observed {
  std::vector<float> l_out, attn;  // [n_tokens, n_embd]; attn empty where not kept
  std::vector<int32_t> experts;    // [n_tokens, k]
};

// Layer l's router and the norm in front of its experts, as f32.
struct Router {
  std::vector<float> w;     // [n_expert][n_embd]
  std::vector<float> bias;  // [n_expert] or empty
  std::vector<float> norm;  // [n_embd]
};

Router load_router(const gguf::GgufFile& f, const model::ModelConfig& cfg, int64_t l) {
  const std::string p = "blk." + std::to_string(l) + ".";
  Router r;
  r.w = model::vector_f32(
      model::require_tensor(f, p + "ffn_gate_inp.weight", {cfg.n_embd, cfg.n_expert}));
  // qwen3moe norms its MoE input with ffn_norm; qwen35moe and gpt-oss with post_attention_norm.
  const std::string norm =
      cfg.arch == "qwen3moe" ? "ffn_norm.weight" : "post_attention_norm.weight";
  r.norm = model::vector_f32(model::require_tensor(f, p + norm, {cfg.n_embd}));
  if (cfg.expert_bias) {
    r.bias = model::vector_f32(model::require_tensor(f, p + "ffn_gate_inp.bias", {cfg.n_expert}));
  }
  return r;
}

// The top n experts of the router applied to the normed row x.
std::vector<int32_t> predict(const Router& r, const float* x, const model::ModelConfig& cfg,
                             int64_t n) {
  const int64_t E = cfg.n_embd, X = cfg.n_expert;
  double ss = 0;
  for (int64_t i = 0; i < E; ++i) ss += static_cast<double>(x[i]) * x[i];
  const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(E) + cfg.rms_eps));
  std::vector<float> xn(static_cast<size_t>(E));
  for (int64_t i = 0; i < E; ++i)
    xn[static_cast<size_t>(i)] = x[i] * inv * r.norm[static_cast<size_t>(i)];
  std::vector<double> logit(static_cast<size_t>(X));
  for (int64_t e = 0; e < X; ++e) {
    const float* w = r.w.data() + e * E;
    double s = r.bias.empty() ? 0.0 : r.bias[static_cast<size_t>(e)];
    for (int64_t i = 0; i < E; ++i) s += static_cast<double>(w[i]) * xn[static_cast<size_t>(i)];
    logit[static_cast<size_t>(e)] = s;
  }
  // Every gating here picks by logit order (softmax keeps it).
  std::vector<int32_t> ids(static_cast<size_t>(X));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
    return logit[static_cast<size_t>(a)] > logit[static_cast<size_t>(b)];
  });
  ids.resize(static_cast<size_t>(n));
  return ids;
}

// Of the k real experts, the share found among `pred`.
double found(std::span<const int32_t> real, const std::vector<int32_t>& pred) {
  int64_t hit = 0;
  for (const int32_t e : real) hit += std::find(pred.begin(), pred.end(), e) != pred.end() ? 1 : 0;
  return static_cast<double>(hit) / static_cast<double>(real.size());
}

}  // namespace

std::vector<PredictionRow> measure_expert_prediction(model::ModelArch& m, const gguf::GgufFile& f,
                                                     std::span<const int32_t> tokens) {
  const model::ModelConfig& cfg = m.config();
  const int64_t L = cfg.n_layer, E = cfg.n_embd, K = cfg.n_expert_used;
  const auto n = static_cast<int64_t>(tokens.size());
  if (n < 1) throw Error("expert prediction: no tokens");
  std::vector<Observed> obs(static_cast<size_t>(L));
  model::ForwardHooks hooks;
  hooks.observe_layer = [&](const model::LayerTrace& t) {
    Observed& o = obs.at(static_cast<size_t>(t.layer));
    o.l_out.assign(t.l_out, t.l_out + t.n_tokens * E);
    if (t.attn_residual) o.attn.assign(t.attn_residual, t.attn_residual + t.n_tokens * E);
    o.experts.assign(t.experts, t.experts + t.n_tokens * K);
  };
  model::KvCache cache = m.make_cache(n, model::KvType::F16, model::KvType::F16);
  std::vector<float> logits(static_cast<size_t>(cfg.n_vocab));
  m.forward(tokens, cache, model::LogitsMode::Last, logits.data(), &hooks);

  std::vector<PredictionRow> rows;
  for (int64_t l = 1; l < L; ++l) {
    const Router r = load_router(f, cfg, l);
    const Observed& prev = obs[static_cast<size_t>(l - 1)];
    const Observed& cur = obs[static_cast<size_t>(l)];
    if (prev.l_out.empty() || cur.experts.empty()) {
      throw Error("expert prediction: layer " + std::to_string(l) + " was not observed");
    }
    PredictionRow row;
    row.layer = l;
    double ho = 0, ro = 0, ha = 0, ra = 0;
    for (int64_t t = 0; t < n; ++t) {
      const std::span<const int32_t> real(cur.experts.data() + t * K, static_cast<size_t>(K));
      const std::vector<int32_t> p2 = predict(r, prev.l_out.data() + t * E, cfg, 2 * K);
      ho += found(real, std::vector<int32_t>(p2.begin(), p2.begin() + K));
      ro += found(real, p2);
      if (!prev.attn.empty()) {
        const std::vector<int32_t> a2 = predict(r, prev.attn.data() + t * E, cfg, 2 * K);
        ha += found(real, std::vector<int32_t>(a2.begin(), a2.begin() + K));
        ra += found(real, a2);
      }
    }
    const auto nd = static_cast<double>(n);
    row.hit_out = ho / nd;
    row.recall2_out = ro / nd;
    if (!prev.attn.empty()) {
      row.hit_attn = ha / nd;
      row.recall2_attn = ra / nd;
    }
    rows.push_back(row);
  }
  return rows;
}

std::string prediction_table(const std::vector<PredictionRow>& rows, int64_t k, int64_t n_expert) {
  std::string s =
      "| layer | from l_out: top k | top 2k | from after attention: top k | top 2k |\n"
      "|---:|---:|---:|---:|---:|\n";
  const auto cell = [](double v) {
    char b[16];
    if (v < 0) return std::string("—");
    std::snprintf(b, sizeof b, "%.1f%%", 100.0 * v);
    return std::string(b);
  };
  double out = 0, out2 = 0, attn = 0, attn2 = 0;
  int64_t with_attn = 0;
  for (const PredictionRow& r : rows) {
    s += "| " + std::to_string(r.layer) + " | " + cell(r.hit_out) + " | " + cell(r.recall2_out) +
         " | " + cell(r.hit_attn) + " | " + cell(r.recall2_attn) + " |\n";
    out += r.hit_out;
    out2 += r.recall2_out;
    if (r.hit_attn < 0) continue;
    attn += r.hit_attn;
    attn2 += r.recall2_attn;
    ++with_attn;
  }
  if (!rows.empty()) {
    const auto nr = static_cast<double>(rows.size());
    const auto na = static_cast<double>(with_attn);
    s += "| mean | " + cell(out / nr) + " | " + cell(out2 / nr) + " | " +
         cell(with_attn > 0 ? attn / na : -1) + " | " + cell(with_attn > 0 ? attn2 / na : -1) +
         " |\n";
  }
  // What a guess without the router finds: k (2k) random experts of n_expert.
  const double chance = static_cast<double>(k) / static_cast<double>(n_expert);
  s += "| chance | " + cell(chance) + " | " + cell(std::min(1.0, 2 * chance)) + " | " +
       cell(chance) + " | " + cell(std::min(1.0, 2 * chance)) + " |\n";
  return s;
}

}  // namespace moe::tools
