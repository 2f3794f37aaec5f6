// The golden-test driver of golden_driver.h: loading golden folders, recording and comparing
// routing, and the forced, own-routing and free-running runs the golden tests check.
#include "tests/model/golden_driver.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "coordinator/model/forced_routing.h"
#include "coordinator/model/generation.h"
#include "tests/testdata.h"

namespace moe::test {

namespace fs = std::filesystem;
using namespace moe::model;

const int32_t* Golden::experts(int64_t layer, int64_t pos, int64_t k) const {
  const auto l = static_cast<size_t>(layer);
  return pos < n_prompt() ? &topk[l][static_cast<size_t>(pos * k)]
                          : &gen_topk[l][static_cast<size_t>((pos - n_prompt()) * k)];
}

Golden load_golden(const fs::path& dir, int64_t n_layer, GoldenExtras extras) {
  Golden g;
  g.dir = dir;
  g.prompt = read_raw<int32_t>(dir / "prompt_tokens.i32");
  g.greedy = read_raw<int32_t>(dir / "greedy_tokens.i32");
  g.prompt_logits = read_raw<float>(dir / "prompt_logits.f32");
  g.greedy_logits = read_raw<float>(dir / "greedy_logits.f32");
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string L = std::to_string(l);
    g.topk.push_back(read_raw<int32_t>(dir / ("moe_topk_" + L + ".i32")));
    g.gen_topk.push_back(read_raw<int32_t>(dir / ("gen_moe_topk_" + L + ".i32")));
    if (extras.l_out) g.l_out.push_back(read_raw<float>(dir / ("l_out_" + L + ".f32")));
    if (extras.attn_residual) {
      g.attn_res.push_back(read_raw<float>(dir / ("attn_residual_" + L + ".f32")));
    }
    if (extras.router_logits) {
      g.router.push_back(read_raw<float>(dir / ("moe_logits_" + L + ".f32")));
    }
  }
  return g;
}

Recorder::Recorder(int64_t n_layer, bool shadow, GoldenExtras extras)
    : l_out(static_cast<size_t>(n_layer)),
      attn_res(extras.attn_residual ? static_cast<size_t>(n_layer) : 0),
      router(extras.router_logits ? static_cast<size_t>(n_layer) : 0),
      shadow_(shadow),
      extras_(extras) {
  hooks.observe_layer = [this](const LayerTrace& t) {
    for (int64_t i = 0; i < t.n_tokens; ++i) {
      Choice c;
      const float* p = t.router_probs + i * t.n_expert;
      c.probs.assign(p, p + t.n_expert);
      if (shadow_) {
        c.ids = own_topk(p, t.n_expert, t.n_expert_used);
      } else {
        c.ids.assign(t.experts + i * t.n_expert_used, t.experts + (i + 1) * t.n_expert_used);
      }
      choices[{t.layer, t.pos0 + i}] = std::move(c);
    }
    if (t.pos0 == 0) {
      const auto l = static_cast<size_t>(t.layer);
      l_out[l].assign(t.l_out, t.l_out + t.n_tokens * t.n_embd);
      if (extras_.attn_residual) {
        ASSERT_NE(t.attn_residual, nullptr);
        attn_res[l].assign(t.attn_residual, t.attn_residual + t.n_tokens * t.n_embd);
      }
      if (extras_.router_logits) {
        router[l].assign(t.router_logits, t.router_logits + t.n_tokens * t.n_expert);
      }
    }
  };
}

RoutingStats compare_routing(const Choices& ch, const Golden& g, int64_t n_layer, int64_t k,
                             int64_t n_pos, double tie) {
  RoutingStats st;
  const int64_t n_prompt = g.n_prompt();
  n_pos = std::min(n_pos, g.n_routed(k));
  for (int64_t pos = 0; pos < n_pos; ++pos) {
    for (int64_t l = 0; l < n_layer; ++l) {
      const auto it = ch.find({l, pos});
      if (it == ch.end()) continue;
      const int32_t* gold = g.experts(l, pos, k);
      (pos < n_prompt ? st.n_prompt : st.n_decode)++;
      if (same_set(it->second.ids, gold, k)) {
        (pos < n_prompt ? st.eq_prompt : st.eq_decode)++;
        continue;
      }
      const double gap = set_gap(it->second, gold, k);
      st.max_gap = std::max(st.max_gap, gap);
      if (pos <= st.first_div_pos) st.primary_gap = std::max(st.primary_gap, gap);
      if (gap > tie) {
        ++st.mismatches_not_near_tie;
        // Downstream: an earlier position, or an earlier layer of this position, already differed.
        if (pos < st.first_div_pos) ++st.primary_not_near_tie;
      }
      st.first_div_pos = std::min(st.first_div_pos, pos);
    }
  }
  return st;
}

std::vector<float> teacher_forced(ModelArch& m, KvCache& cache, std::span<const int32_t> prompt,
                                  std::span<const int32_t> steps, const ForwardHooks* hooks) {
  std::vector<float> out = evaluate_batch(m, cache, prompt, hooks);
  std::vector<float> row(static_cast<size_t>(m.config().n_vocab));
  for (size_t s = 0; s < steps.size(); ++s) {
    m.forward(steps.subspan(s, 1), cache, LogitsMode::Last, row.data(), hooks);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

std::vector<float> run_forced(ModelArch& m, const Golden& g, KvType kv, Recorder* rec) {
  return run_forced(m, g, KvConfig::uniform(kv, kv), rec);
}

std::vector<float> run_forced(ModelArch& m, const Golden& g, const KvConfig& kv, Recorder* rec) {
  const ModelConfig& cfg = m.config();
  ForcedRouting forced(g.dir.string(), cfg.n_layer, cfg.n_expert_used);
  ForwardHooks hooks = forced.hooks();
  if (rec != nullptr) hooks.observe_layer = rec->hooks.observe_layer;
  KvCache cache = m.make_cache(kGoldenCtx, kv);
  // The last greedy token's logits are not in the goldens: it is not fed.
  const std::span<const int32_t> steps(g.greedy.data(), g.greedy.empty() ? 0 : g.greedy.size() - 1);
  return teacher_forced(m, cache, g.prompt, steps, &hooks);
}

std::vector<GoldenKvFolder> golden_kv_folders() {
  KvConfig norot = KvConfig::uniform(KvType::Q4_0, KvType::Q4_0);
  norot.rotate = false;
  return {{"f16", KvConfig::uniform(KvType::F16, KvType::F16), 0.05, 0.01},
          {"q8_0", KvConfig::uniform(KvType::Q8_0, KvType::Q8_0), 0.30, 0.05},
          {"q4_0-rot", KvConfig::uniform(KvType::Q4_0, KvType::Q4_0), 0.90, 0.13},
          {"q4_0-norot", norot, 0.90, 0.13}};
}

std::vector<float> run_forced(ModelArch& m, const fs::path& dir, KvType kv) {
  return run_forced(m, load_golden(dir), kv);
}

std::vector<float> golden_rows(const Golden& g) {
  std::vector<float> rows = g.prompt_logits;
  // greedy row 0 is the last prompt row; rows 1.. come from the decode steps.
  const size_t V = g.greedy_logits.size() / g.greedy.size();
  rows.insert(rows.end(), g.greedy_logits.begin() + static_cast<std::ptrdiff_t>(V),
              g.greedy_logits.end());
  return rows;
}

LogitDiffs compare_logits(const std::vector<float>& rows, const Golden& g) {
  const int64_t n_prompt = g.n_prompt(), n_greedy = g.n_greedy();
  const auto V = static_cast<int64_t>(g.prompt_logits.size()) / n_prompt;
  if (rows.size() != static_cast<size_t>((n_prompt + n_greedy - 1) * V) ||
      g.greedy_logits.size() != static_cast<size_t>(n_greedy * V)) {
    throw std::runtime_error("compare_logits: " + std::to_string(rows.size()) +
                             " logits do not line up with the goldens of " + g.dir.string());
  }
  LogitDiffs d;
  d.prompt.add(rows.data(), g.prompt_logits.data(), n_prompt * V);
  // The last prompt row, then the decode rows: greedy rows 0, 1, ...
  d.decode.add(rows.data() + (n_prompt - 1) * V, g.greedy_logits.data(), n_greedy * V);
  return d;
}

void run_own(ModelArch& m, const Golden& g, Recorder& rec) {
  KvCache cache = m.make_cache(kGoldenCtx, KvType::F32, KvType::F32);
  teacher_forced(m, cache, g.prompt, g.greedy, &rec.hooks);
}

FreeRun run_free(ModelArch& m, const Golden& g, Recorder& rec, double tie) {
  const ModelConfig& cfg = m.config();
  const int64_t n_prompt = g.n_prompt(), n_greedy = g.n_greedy();
  GenerateOptions opt;
  opt.n_steps = n_greedy;
  opt.hooks = &rec.hooks;
  KvCache cache = m.make_cache(kGoldenCtx, KvType::F32, KvType::F32);
  FreeRun r;
  r.tokens = generate(m, cache, g.prompt, opt).tokens;
  while (r.agree < n_greedy &&
         r.tokens[static_cast<size_t>(r.agree)] == g.greedy[static_cast<size_t>(r.agree)]) {
    ++r.agree;
  }
  r.routing =
      compare_routing(rec.choices, g, cfg.n_layer, cfg.n_expert_used, n_prompt + r.agree, tie);
  // Token s comes from position n_prompt - 1 + s: it must agree when no earlier routing differed.
  r.must_agree = std::clamp<int64_t>(
      r.routing.first_div_pos == INT64_MAX ? n_greedy : r.routing.first_div_pos - n_prompt + 1, 0,
      n_greedy);
  if (r.agree < r.must_agree) {
    const float* gl = g.greedy_logits.data() + r.agree * cfg.n_vocab;
    r.argmax_gap =
        gl[g.greedy[static_cast<size_t>(r.agree)]] - gl[r.tokens[static_cast<size_t>(r.agree)]];
  }
  return r;
}

GoldenRun run_golden(ModelArch& m, const Golden& g, double tie, GoldenExtras extras) {
  const ModelConfig& cfg = m.config();
  const int64_t L = cfg.n_layer, K = cfg.n_expert_used;
  const int64_t n_prompt = g.n_prompt(), n_greedy = g.n_greedy();
  GoldenRun r;
  // 1. Forced routing, teacher-forced decode; the router's own choice is recorded alongside.
  r.forced = std::make_unique<Recorder>(L, /*shadow=*/true, extras);
  r.logits = compare_logits(run_forced(m, g, KvType::F32, r.forced.get()), g);
  r.shadow = compare_routing(r.forced->choices, g, L, K, n_prompt + n_greedy - 1, tie);
  // 2. Own routing, teacher-forced on the golden tokens: expert sets.
  Recorder own(L, /*shadow=*/false, extras);
  run_own(m, g, own);
  r.own = compare_routing(own.choices, g, L, K, n_prompt + n_greedy, tie);
  // 3. Free-running greedy with own routing.
  Recorder free_run(L, /*shadow=*/false, extras);
  r.free = run_free(m, g, free_run, tie);
  return r;
}

}  // namespace moe::test
