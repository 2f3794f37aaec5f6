// qwen35moe against llama.cpp's goldens for the tiny random-weight models (F16, Q8_0, Q4_K_M) and
// both prompts (testdata-qwen35moe/README.md §7, §9, §10), plus the sequence-state contract:
//  * tokenizer and chat template reproduce the prompt ids and chat.txt;
//  * forced routing (golden experts): prompt logits and teacher-forced greedy logits, l_out,
//    attn_residual and router logits per layer within thresholds measured here (see kTol);
//  * own routing: expert sets mostly equal, mismatches only at near ties; free-running greedy
//    tokens equal the golden ones up to the first routing divergence;
//  * one batch = token by token = chunks; clear() and a failed forward leave no trace; context
//    overflow; thread count; MTP blocks ignored; the out-of-process expert worker bit for bit.
// Measured numbers are printed ([q35-golden] lines) for the docs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/chat_template/chat_template.h"
#include "coordinator/model/forced_routing.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "experts/cpu_expert_executor.h"
#include "experts/remote_expert_executor.h"
#include "tests/model/alloc_counter.h"
#include "tests/model/fused_experts.h"
#include "tests/model/gguf_rewrite.h"
#include "tests/model/golden_driver.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using namespace moe::model;
using moe::test::Diff;
using moe::test::Golden;
using moe::test::GoldenRun;
using moe::test::RoutingStats;

const std::vector<std::string> kModels = {"F16", "Q8_0", "Q4_K_M"};
constexpr int64_t kCtx = 512;  // as the golden runs

fs::path root() { return moe::test::qwen35moe_testdata_dir(); }
std::string model_path(const std::string& m) {
  return (root() / "models" / ("tiny-qwen35moe-sv-" + m + ".gguf")).string();
}
fs::path golden_dir(const std::string& m, const std::string& prompt) {
  return root() / "golden" / ("tiny-qwen35moe-sv-" + m) / prompt;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string tmp_path(const std::string& tag) {
  return (fs::temp_directory_path() /
          ("moe_q35_" + tag + "_" + std::to_string(::getpid()) + ".gguf"))
      .string();
}

// Thresholds with headroom over what this implementation measures (printed by the golden test;
// worst of raw/chat and of the AVX2 and scalar kernels, MOE_ISA=scalar):
//  * F16: llama.cpp's F16 expert matmuls accumulate in fp16 (README §9), which puts its logits
//    0.02-0.035 from exact math; we accumulate in f32 and land where README's float64 pass does.
//    Measured: prompt 0.025 max / 0.0045 RMS, greedy 0.036 / 0.0067, per-layer residuals 1.9e-3
//    relative, router logits 6.2e-3. README §10's 0.05 / 0.01 on logits is below every bug of the
//    §9 sensitivity table (the subtlest, RoPE on adjacent pairs, moves logits by >= 0.35 max).
//    Router probabilities move by ~ p * 6e-3 < 2e-3, the near-tie bound.
//  * Q8_0 / Q4_K_M: activations are quantized as llama.cpp does (Q8_0 / Q8_K), so layers agree to
//    ~1e-7 until an isolated activation-rounding flip (a value on a rounding boundary after a
//    last-bit difference in an expf or a sum; its position depends on the kernel ISA), which the
//    recurrent state then carries to every later token. Measured: prompt 0.21 max / 0.033 RMS,
//    greedy 0.32 / 0.063, residuals 1.2e-2 relative, router logits 6.5e-2 (README's numpy emulation
//    of the same rounding: 0.13-0.21 / 0.014-0.033 on prompts).
struct Tol {
  double logit_max, logit_rms;  // prompt rows and teacher-forced greedy rows
  double layer_rel;             // l_out / attn_residual: ||ours - golden|| / ||golden||
  double router_max;            // router logits, max abs
  double near_tie;              // router probability gap counted as a near tie
};
Tol tolerance(const std::string& m) {
  if (m == "F16") return {0.05, 0.01, 5e-3, 0.015, 2e-3};
  return {0.6, 0.1, 5e-2, 0.15, 2e-2};
}
// qwen35moe's goldens also hold every layer's mixer residual and router logits: both compared.
constexpr moe::test::GoldenExtras kExtras{.attn_residual = true, .router_logits = true};

// ---- tokenizer and chat template ----

TEST(Qwen35Prompts, TokensAndChatTemplate) {
  const std::string raw = read_file(root() / "prompts" / "raw.txt");
  const std::string chat = read_file(root() / "prompts" / "chat.txt");
  const auto spec =
      nlohmann::ordered_json::parse(read_file(root() / "prompts" / "chat_messages.json"));
  for (const std::string& m : kModels) {
    SCOPED_TRACE(m);
    const auto file = moe::gguf::GgufFile::open(model_path(m));
    const auto tok = moe::tokenizer::Tokenizer::from_gguf(file);
    EXPECT_FALSE(tok.add_bos());
    EXPECT_EQ(tok.encode(raw, true),
              moe::test::read_raw<int32_t>(golden_dir(m, "raw") / "prompt_tokens.i32"));
    EXPECT_EQ(tok.encode(chat, true),
              moe::test::read_raw<int32_t>(golden_dir(m, "chat") / "prompt_tokens.i32"));
    const moe::ChatTemplate tmpl{std::string(file.require_string("tokenizer.chat_template"))};
    moe::ChatTemplateInputs in;
    in.messages = spec.at("messages");
    in.add_generation_prompt = spec.at("add_generation_prompt").get<bool>();
    EXPECT_TRUE(in.add_generation_prompt);
    EXPECT_EQ(tmpl.render(in), chat);
  }
}

// ---- goldens ----

class Qwen35Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Qwen35Golden, MatchesLlamaCpp) {
  const std::string m = GetParam();
  const auto file = moe::gguf::GgufFile::open(model_path(m));
  // One thread: results do not depend on the thread count (ThreadCount test below).
  moe::cpu::ThreadPool pool(1);
  auto model = create_model_arch(file, pool);
  ASSERT_EQ(model->name(), "qwen35moe");
  const ModelConfig& cfg = model->config();
  const int64_t V = cfg.n_vocab, L = cfg.n_layer;
  const Tol tol = tolerance(m);

  for (const char* prompt_name : {"raw", "chat"}) {
    SCOPED_TRACE(m + "/" + prompt_name);
    const fs::path dir = golden_dir(m, prompt_name);
    const Golden g = moe::test::load_golden(dir, L, kExtras);
    const auto n_prompt = g.n_prompt();
    const auto n_greedy = g.n_greedy();
    ASSERT_EQ(g.prompt_logits.size(), static_cast<size_t>(n_prompt * V));
    ASSERT_EQ(g.greedy_logits.size(), static_cast<size_t>(n_greedy * V));

    // 1. forced routing, teacher-forced decode, the router's own choice recorded alongside;
    // 2. own routing, teacher-forced on the golden tokens; 3. free-running greedy, own routing.
    const GoldenRun run = moe::test::run_golden(*model, g, tol.near_tie, kExtras);
    const Diff& d_prompt = run.logits.prompt;
    const Diff& d_decode = run.logits.decode;
    const moe::test::Recorder& fr = *run.forced;
    double lout_rel = 0, attn_rel = 0, router_max = 0;
    std::string per_layer;
    for (int64_t l = 0; l < L; ++l) {
      const auto li = static_cast<size_t>(l);
      ASSERT_EQ(fr.l_out[li].size(), g.l_out[li].size());
      ASSERT_EQ(fr.attn_res[li].size(), g.attn_res[li].size());
      ASSERT_EQ(fr.router[li].size(), g.router[li].size());
      Diff dl, da, dr;
      dl.add(fr.l_out[li].data(), g.l_out[li].data(), static_cast<int64_t>(g.l_out[li].size()));
      da.add(fr.attn_res[li].data(), g.attn_res[li].data(),
             static_cast<int64_t>(g.attn_res[li].size()));
      dr.add(fr.router[li].data(), g.router[li].data(), static_cast<int64_t>(g.router[li].size()));
      lout_rel = std::max(lout_rel, dl.rel());
      attn_rel = std::max(attn_rel, da.rel());
      router_max = std::max(router_max, dr.max);
      char buf[96];
      std::snprintf(buf, sizeof buf, " L%lld %.1e/%.1e/%.1e", static_cast<long long>(l), da.rel(),
                    dl.rel(), dr.max);
      per_layer += buf;
    }
    const RoutingStats& shadow = run.shadow;
    EXPECT_LE(d_prompt.max, tol.logit_max);
    EXPECT_LE(d_prompt.rms(), tol.logit_rms);
    EXPECT_LE(d_decode.max, tol.logit_max);
    EXPECT_LE(d_decode.rms(), tol.logit_rms);
    EXPECT_LE(lout_rel, tol.layer_rel);
    EXPECT_LE(attn_rel, tol.layer_rel);
    EXPECT_LE(router_max, tol.router_max);
    EXPECT_EQ(shadow.mismatches_not_near_tie, 0)
        << "router disagrees beyond a near tie (max gap " << shadow.max_gap << ")";

    // 2. Own routing: expert sets.
    const RoutingStats& rs = run.own;
    EXPECT_EQ(rs.n(), (n_prompt + n_greedy) * L);
    EXPECT_GE(static_cast<double>(rs.eq()), 0.95 * static_cast<double>(rs.n()));
    EXPECT_EQ(rs.primary_not_near_tie, 0) << "first routing divergence is not a near tie";

    // 3. Free-running greedy: equal tokens up to the first routing divergence.
    const int64_t agree = run.free.agree;
    const RoutingStats& fs_ = run.free.routing;
    // Before that point a different token is only acceptable where llama.cpp's own top two
    // logits were within the logit tolerance (a near tie of the argmax).
    const double argmax_gap = run.free.argmax_gap;
    if (agree < run.free.must_agree) {
      EXPECT_LE(argmax_gap, tol.logit_max) << "greedy token " << agree << " differs";
    }
    if (m == "F16") {
      EXPECT_EQ(agree, n_greedy) << "README §10: F16 reproduces every token";
    }

    std::printf(
        "[q35-golden] %-6s %-4s forced: prompt max %.5f rms %.6f | greedy max %.5f rms %.6f | "
        "attn_res/l_out rel, router max:%s | shadow mism %lld/%lld (max gap %.1e) | own sets "
        "%lld/%lld (max gap %.1e, first %.1e) | greedy %lld/%lld (first routing div at pos %lld, "
        "argmax gap "
        "%.3f)\n",
        m.c_str(), prompt_name, d_prompt.max, d_prompt.rms(), d_decode.max, d_decode.rms(),
        per_layer.c_str(), static_cast<long long>(shadow.n() - shadow.eq()),
        static_cast<long long>(shadow.n()), shadow.max_gap, static_cast<long long>(rs.eq()),
        static_cast<long long>(rs.n()), rs.max_gap, rs.primary_gap, static_cast<long long>(agree),
        static_cast<long long>(n_greedy),
        static_cast<long long>(fs_.first_div_pos == INT64_MAX ? -1 : fs_.first_div_pos),
        argmax_gap);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Qwen35Golden, ::testing::ValuesIn(kModels),
                         [](const auto& info) { return info.param; });

// ---- sequence state ----

struct Loaded {
  moe::gguf::GgufFile file;
  moe::cpu::ThreadPool pool;
  std::unique_ptr<ModelArch> model;
  std::vector<int32_t> prompt, greedy;
  // Model `m` (or the file `path` standing in for it), with m's chat prompt and greedy tokens.
  explicit Loaded(const std::string& m, int threads = 1, const std::string& path = "")
      : file(moe::gguf::GgufFile::open(path.empty() ? model_path(m) : path)), pool(threads) {
    model = create_model_arch(file, pool);
    prompt = moe::test::read_raw<int32_t>(golden_dir(m, "chat") / "prompt_tokens.i32");
    greedy = moe::test::read_raw<int32_t>(golden_dir(m, "chat") / "greedy_tokens.i32");
  }
  int64_t V() const { return model->config().n_vocab; }
};

// Logits of every prompt row (in batches of `chunk` tokens; 0 = one batch) followed by `steps`
// teacher-forced decode steps on the golden greedy tokens.
std::vector<float> run(Loaded& x, KvCache& cache, int64_t chunk, int64_t steps,
                       const ForwardHooks* hooks = nullptr) {
  const auto n = static_cast<int64_t>(x.prompt.size());
  const int64_t V = x.V();
  std::vector<float> out(static_cast<size_t>((n + steps) * V));
  const int64_t c = chunk > 0 ? chunk : n;
  for (int64_t i = 0; i < n; i += c) {
    const int64_t len = std::min(c, n - i);
    x.model->forward(std::span<const int32_t>(x.prompt.data() + i, static_cast<size_t>(len)), cache,
                     LogitsMode::All, out.data() + i * V, hooks);
  }
  for (int64_t s = 0; s < steps; ++s) {
    x.model->forward(std::span<const int32_t>(&x.greedy[static_cast<size_t>(s)], 1), cache,
                     LogitsMode::Last, out.data() + (n + s) * V, hooks);
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return m;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Qwen35State, KvCacheOnlyForAttentionLayers) {
  Loaded x("F16");
  const ModelConfig& cfg = x.model->config();
  ASSERT_EQ(cfg.n_layer, 4);
  EXPECT_EQ(cfg.n_nextn, 0);
  KvCache cache = x.model->make_cache(16, KvType::F16, KvType::F16);
  for (int64_t l = 0; l < 3; ++l) {
    EXPECT_TRUE(cfg.is_recurrent(l));
    EXPECT_TRUE(cache.has_recurrent(l));
    EXPECT_EQ(cache.k_row_elems(l), 0);
  }
  EXPECT_FALSE(cfg.is_recurrent(3));
  EXPECT_FALSE(cache.has_recurrent(3));
  EXPECT_EQ(cache.k_row_elems(3), 2 * 64);
  EXPECT_EQ(cache.v_row_elems(3), 2 * 64);
  std::vector<float> row(128);
  EXPECT_THROW(cache.store(0, 0, row.data(), row.data()), moe::Error);
  EXPECT_THROW(cache.recurrent(3), moe::Error);
}

TEST(Qwen35State, BatchEqualsTokenByTokenAndChunks) {
  for (const std::string& m : {std::string("F16"), std::string("Q4_K_M")}) {
    SCOPED_TRACE(m);
    Loaded x(m);
    // Routing forced to the golden experts so that a near tie cannot turn a rounding difference
    // (GEMM vs GEMV accumulation order) into a different expert.
    ForcedRouting forced(golden_dir(m, "chat").string(), x.model->config().n_layer,
                         x.model->config().n_expert_used);
    const ForwardHooks hooks = forced.hooks();
    KvCache c1 = x.model->make_cache(kCtx, KvType::F32, KvType::F32);
    const std::vector<float> batch = run(x, c1, 0, 4, &hooks);
    KvCache c2 = x.model->make_cache(kCtx, KvType::F32, KvType::F32);
    const std::vector<float> single = run(x, c2, 1, 4, &hooks);
    KvCache c3 = x.model->make_cache(kCtx, KvType::F32, KvType::F32);
    const std::vector<float> chunks = run(x, c3, 17, 4, &hooks);
    const double d1 = max_abs_diff(batch, single), d2 = max_abs_diff(batch, chunks);
    std::printf("[q35-state] %s batch vs token by token max %.2e, vs chunks of 17 max %.2e\n",
                m.c_str(), d1, d2);
    // Batched and one-row matmuls sum in different orders; with F16 weights the last-bit
    // differences flip some F16 roundings of activations (measured 7.4e-3, the size of llama.cpp's
    // own F16-vs-F32 difference); K-quant rows of one super-block sum in the same order (5e-6).
    // A state carried wrongly between batches moves logits by >= 10 (README §9).
    const double tol = m == "F16" ? 0.03 : 1e-3;
    EXPECT_LE(d1, tol);
    EXPECT_LE(d2, tol);
    EXPECT_EQ(c1.n_past(), c2.n_past());
  }
}

TEST(Qwen35State, ClearAndFreshCachesGiveIdenticalLogits) {
  Loaded x("Q8_0");
  KvCache cache = x.model->make_cache(kCtx, KvType::F16, KvType::F16);
  const std::vector<float> first = run(x, cache, 0, 3);
  cache.clear();
  EXPECT_EQ(cache.n_past(), 0);
  const std::vector<float> again = run(x, cache, 0, 3);
  EXPECT_TRUE(bitwise_equal(first, again));
  // An odd number of batches leaves the other buffer current: clear() must not depend on it.
  cache.clear();
  run(x, cache, 7, 1);  // 8 prompt batches and one decode step
  cache.clear();
  EXPECT_TRUE(bitwise_equal(run(x, cache, 0, 3), first));
  KvCache fresh = x.model->make_cache(kCtx, KvType::F16, KvType::F16);
  EXPECT_TRUE(bitwise_equal(run(x, fresh, 0, 3), first));
}

TEST(Qwen35State, FailedForwardLeavesStateUnchanged) {
  Loaded x("F16");
  const int64_t V = x.V();
  const auto n = static_cast<int64_t>(x.prompt.size());
  // Reference: prompt, then two decode steps.
  KvCache ref_cache = x.model->make_cache(kCtx, KvType::F32, KvType::F32);
  const std::vector<float> ref = run(x, ref_cache, 0, 2);

  // A hook that throws in the last layer's FFN: every DeltaNet layer and the attention layer's
  // K/V have already been written for the batch when it fires.
  ForwardHooks boom;
  boom.force_experts = [](int64_t layer, int64_t, int32_t*) -> bool {
    if (layer == 3) throw moe::Error("injected failure");
    return false;
  };
  std::vector<float> logits(static_cast<size_t>(n * V));
  KvCache cache = x.model->make_cache(kCtx, KvType::F32, KvType::F32);
  // Failing at the start of a sequence, then with a bad token id, then mid-way in the graph.
  EXPECT_THROW(x.model->forward(x.prompt, cache, LogitsMode::All, logits.data(), &boom),
               moe::Error);
  EXPECT_EQ(cache.n_past(), 0);
  std::vector<int32_t> bad(x.prompt);
  bad[5] = static_cast<int32_t>(V);
  EXPECT_THROW(x.model->forward(bad, cache, LogitsMode::All, logits.data()), moe::Error);
  x.model->forward(x.prompt, cache, LogitsMode::All, logits.data());
  EXPECT_TRUE(bitwise_equal(
      logits, std::vector<float>(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(n * V))));
  std::vector<float> row(static_cast<size_t>(V));
  const std::vector<int32_t> two = {x.greedy[0], x.greedy[1]};
  EXPECT_THROW(x.model->forward(two, cache, LogitsMode::Last, row.data(), &boom), moe::Error);
  const std::vector<int32_t> bad_two = {x.greedy[0], -1};
  EXPECT_THROW(x.model->forward(bad_two, cache, LogitsMode::Last, row.data()), moe::Error);
  EXPECT_EQ(cache.n_past(), n);
  for (int64_t s = 0; s < 2; ++s) {
    x.model->forward(std::span<const int32_t>(&x.greedy[static_cast<size_t>(s)], 1), cache,
                     LogitsMode::Last, row.data());
    EXPECT_EQ(std::memcmp(row.data(), ref.data() + (n + s) * V, row.size() * sizeof(float)), 0)
        << "step " << s;
  }
}

TEST(Qwen35State, ContextOverflowIsAnError) {
  Loaded x("Q4_K_M");
  KvCache cache = x.model->make_cache(8, KvType::F16, KvType::F16);
  std::vector<float> logits(static_cast<size_t>(9 * x.V()));
  const std::vector<int32_t> nine(x.prompt.begin(), x.prompt.begin() + 9);
  try {
    x.model->forward(nine, cache, LogitsMode::All, logits.data());
    FAIL() << "no error";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("context length 8 exceeded"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cache.n_past(), 0);
  x.model->forward(std::span<const int32_t>(nine.data(), 7), cache, LogitsMode::Last,
                   logits.data());
  x.model->forward(std::span<const int32_t>(nine.data(), 1), cache, LogitsMode::Last,
                   logits.data());
  EXPECT_EQ(cache.n_past(), 8);
  EXPECT_THROW(x.model->forward(std::span<const int32_t>(nine.data(), 1), cache, LogitsMode::Last,
                                logits.data()),
               moe::Error);
  EXPECT_EQ(cache.n_past(), 8);
  cache.clear();
  GenerateOptions opt;
  opt.n_steps = 4;
  EXPECT_THROW(generate(*x.model, cache, std::span<const int32_t>(nine.data(), 6), opt),
               moe::Error);
}

TEST(Qwen35State, ThreadCountDoesNotChangeResults) {
  Loaded one("Q4_K_M", 1), three("Q4_K_M", 3);
  KvCache c1 = one.model->make_cache(kCtx, KvType::F32, KvType::F32);
  KvCache c3 = three.model->make_cache(kCtx, KvType::F32, KvType::F32);
  EXPECT_TRUE(bitwise_equal(run(one, c1, 0, 4), run(three, c3, 0, 4)));
}

TEST(Qwen35State, DecodeAllocatesNothing) {
  Loaded x("Q4_K_M", 2);
  const int64_t at_start = moe::test::allocation_count();
  KvCache cache = x.model->make_cache(kCtx, KvType::F16, KvType::F16);
  EXPECT_GT(moe::test::allocation_count(), at_start) << "the counter counts nothing";
  std::vector<float> row(static_cast<size_t>(x.V()));
  x.model->forward(x.prompt, cache, LogitsMode::Last, row.data());
  const auto step = [&](size_t s) {
    x.model->forward(std::span<const int32_t>(&x.greedy[s], 1), cache, LogitsMode::Last,
                     row.data());
  };
  step(0);  // scratch grows to its one-token size
  const int64_t before = moe::test::allocation_count();
  for (size_t s = 1; s < 9; ++s) step(s);
  EXPECT_EQ(moe::test::allocation_count() - before, 0);
}

TEST(Qwen35State, QuantizedKvCacheStaysClose) {
  Loaded x("F16");
  KvCache f32 = x.model->make_cache(kCtx, KvType::F32, KvType::F32);
  KvCache q8 = x.model->make_cache(kCtx, KvType::Q8_0, KvType::Q8_0);
  const double d = max_abs_diff(run(x, f32, 0, 8), run(x, q8, 0, 8));
  std::printf("[q35-state] q8_0 KV cache vs f32: max %.4f\n", d);
  EXPECT_GT(d, 0.0);
  EXPECT_LE(d, 0.3);  // as qwen3moe's bound; only one layer of four has a KV cache
}

// ---- real-file variations and the expert seam ----

// Real Qwen3.5/3.6 GGUFs append an MTP block (nextn_predict_layers = 1, blk.{n_layer}.*): it must
// load and be ignored.
TEST(Qwen35Model, MtpBlockIsIgnored) {
  const std::string src = model_path("Q8_0"), dst = tmp_path("mtp");
  moe::test::GgufEdit e;
  e.drop_key = [](const std::string& k) { return k == "qwen35moe.block_count"; };
  e.add_keys = [](moe::gguf::GgufWriter& w) {
    w.set_u32("qwen35moe.block_count", 5);
    w.set_u32("qwen35moe.nextn_predict_layers", 1);
  };
  const auto file = moe::gguf::GgufFile::open(src);
  for (const auto& t : file.tensors()) {
    const std::string name(t.name);
    if (name.rfind("blk.3.", 0) == 0) e.copies.push_back({"blk.4." + name.substr(6), name});
  }
  e.zeros = {{"blk.4.nextn.eh_proj.weight", {512, 256}},
             {"blk.4.nextn.enorm.weight", {256}},
             {"blk.4.nextn.hnorm.weight", {256}}};
  moe::test::rewrite_gguf(src, dst, e);
  {
    Loaded orig("Q8_0"), mtp("Q8_0", 1, dst);
    const ModelConfig& cfg = mtp.model->config();
    EXPECT_EQ(cfg.n_layer, 4);
    EXPECT_EQ(cfg.n_nextn, 1);
    KvCache a = orig.model->make_cache(64, KvType::F32, KvType::F32);
    KvCache b = mtp.model->make_cache(64, KvType::F32, KvType::F32);
    EXPECT_TRUE(bitwise_equal(run(mtp, b, 0, 2), run(orig, a, 0, 2)));
    // The worker-side executor covers the main layers only.
    const auto experts = cpu_experts_for(mtp.file, mtp.pool);
    std::vector<float> xin(256, 0.5f), out(256);
    const ExpertItem item{0, 1, 1.0f};
    experts->run(3, xin.data(), 1, std::span<const ExpertItem>(&item, 1), out.data());
    EXPECT_THROW(experts->run(4, xin.data(), 1, std::span<const ExpertItem>(&item, 1), out.data()),
                 moe::Error);
  }
  fs::remove(dst);
}

// Files that fuse gate and up experts into ffn_gate_up_exps give the same logits bit for bit, in
// process and through the worker-side executor (both read experts through ExpertProjection).
TEST(Qwen35Model, FusedGateUpExpertsGiveIdenticalLogits) {
  const std::string dst = tmp_path("fused");
  moe::test::write_fused_gate_up(model_path("Q4_K_M"), dst);
  {
    Loaded orig("Q4_K_M"), fused("Q4_K_M", 1, dst);
    ASSERT_NE(fused.file.find_tensor("blk.0.ffn_gate_up_exps.weight"), nullptr);
    ASSERT_EQ(fused.file.find_tensor("blk.0.ffn_gate_exps.weight"), nullptr);
    KvCache a = orig.model->make_cache(64, KvType::F32, KvType::F32);
    KvCache b = fused.model->make_cache(64, KvType::F32, KvType::F32);
    EXPECT_TRUE(bitwise_equal(run(fused, b, 0, 2), run(orig, a, 0, 2)));
  }
  // Both layouts at once are ambiguous: refused, naming the tensor.
  const std::string both = tmp_path("both");
  moe::test::GgufEdit e;
  e.copies.push_back({"blk.1.ffn_gate_up_exps.weight", "blk.1.ffn_gate_exps.weight"});
  moe::test::rewrite_gguf(model_path("Q4_K_M"), both, e);
  {
    const auto file = moe::gguf::GgufFile::open(both);
    moe::cpu::ThreadPool pool(1);
    try {
      create_model_arch(file, pool);
      ADD_FAILURE() << "a file with fused and separate gate/up experts loaded";
    } catch (const moe::Error& err) {
      EXPECT_NE(std::string(err.what()).find("blk.1.ffn_gate_up_exps"), std::string::npos)
          << err.what();
    }
  }
  fs::remove(dst);
  fs::remove(both);
}

// Routed experts in a moe-cpu-worker process give the in-process logits bit for bit: nothing in
// the executor seam or the worker assumes qwen3moe.
TEST(Qwen35Model, OutOfProcessExpertsMatchInProcess) {
  const std::string path = model_path("Q4_K_M");
  Loaded x("Q4_K_M", 2);
  KvCache a = x.model->make_cache(kCtx, KvType::F32, KvType::F32);
  const std::vector<float> want = run(x, a, 0, 4);

  const ModelConfig cfg = ModelConfig::from_gguf(x.file);
  RemoteExpertOptions o;
  o.worker_bin = std::string(MOE_BIN_DIR) + "/moe-cpu-worker";
  o.model_path = path;
  o.n_embd = cfg.n_embd;
  o.threads = 2;  // the same as the in-process pool: same kernels, same order
  o.max_tokens = 64;
  o.max_items = 64 * cfg.n_expert_used;
  o.spin = 0;
  x.model = create_model_arch(x.file, x.pool, std::make_unique<RemoteExpertExecutor>(o));
  KvCache b = x.model->make_cache(kCtx, KvType::F32, KvType::F32);
  EXPECT_TRUE(bitwise_equal(run(x, b, 0, 4), want));
}

}  // namespace
