// KV cache types (f16/q8_0/q4_0/iq4_nl close to f32), context overflow, the CPU attention over an
// iq4_nl cache, and the cache's own bookkeeping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/model/attention.h"
#include "coordinator/model/forced_routing.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "kernels/cpu/hadamard.h"
#include "tests/model/synth_model.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using namespace moe::model;

// Prompt batch + 16 teacher-forced decode steps on the golden F16 model, routing forced.
std::vector<float> run_with_cache(ModelArch& model, const fs::path& dir, KvType kt, KvType vt) {
  const auto prompt = moe::test::read_raw<int32_t>(dir / "prompt_tokens.i32");
  const auto greedy = moe::test::read_raw<int32_t>(dir / "greedy_tokens.i32");
  ForcedRouting forced(dir.string(), model.config().n_layer, model.config().n_expert_used);
  const ForwardHooks hooks = forced.hooks();
  KvCache cache = model.make_cache(256, kt, vt);
  std::vector<float> logits = evaluate_batch(model, cache, prompt, &hooks);
  std::vector<float> row(static_cast<size_t>(model.config().n_vocab));
  for (size_t s = 0; s < 16; ++s) {
    model.forward(std::span<const int32_t>(&greedy[s], 1), cache, LogitsMode::Last, row.data(),
                  &hooks);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

TEST(KvCache, QuantizedTypesStayCloseToF32) {
  const fs::path root = moe::test::testdata_dir();
  const auto file = moe::gguf::GgufFile::open((root / "models/tiny-qwen3moe-sv-F16.gguf").string());
  moe::cpu::ThreadPool pool(1);
  auto model = create_model_arch(file, pool);
  const fs::path dir = root / "golden/tiny-qwen3moe-sv-F16/chat";
  const std::vector<float> base = run_with_cache(*model, dir, KvType::F32, KvType::F32);
  struct T {
    KvType k, v;
    double max, rms;
  };
  // Loose bounds: f16 rounding is tiny, bf16 and q8_0 small, 5-bit larger, 4-bit coarse.
  for (const T& t :
       {T{KvType::F16, KvType::F16, 0.05, 0.01}, T{KvType::Q8_0, KvType::Q8_0, 0.3, 0.05},
        T{KvType::Q4_0, KvType::Q4_0, 2.0, 0.4}, T{KvType::F16, KvType::Q8_0, 0.3, 0.05},
        T{KvType::BF16, KvType::BF16, 0.3, 0.05}, T{KvType::Q5_0, KvType::Q5_1, 1.0, 0.2},
        T{KvType::Q4_1, KvType::Q4_1, 2.0, 0.4}, T{KvType::IQ4_NL, KvType::IQ4_NL, 2.0, 0.4},
        T{KvType::F16, KvType::IQ4_NL, 2.0, 0.4}}) {
    const std::vector<float> got = run_with_cache(*model, dir, t.k, t.v);
    ASSERT_EQ(got.size(), base.size());
    double mx = 0, ss = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double d = got[i] - base[i];
      mx = std::max(mx, std::fabs(d));
      ss += d * d;
    }
    const double rms = std::sqrt(ss / static_cast<double>(got.size()));
    std::printf("[kv-cache] K %s V %s vs f32: max|diff| %.4f rms %.5f\n",
                std::string(kv_type_name(t.k)).c_str(), std::string(kv_type_name(t.v)).c_str(), mx,
                rms);
    EXPECT_LE(mx, t.max) << kv_type_name(t.k);
    EXPECT_LE(rms, t.rms) << kv_type_name(t.k);
    EXPECT_GT(mx, 0.0) << "a quantized cache should change something";
  }
}

TEST(KvCache, ContextOverflowIsAnError) {
  const std::string path =
      (fs::temp_directory_path() / ("moe_model_kv_" + std::to_string(::getpid()) + ".gguf"))
          .string();
  moe::test::write_synth(path, {});
  const auto file = moe::gguf::GgufFile::open(path);
  moe::cpu::ThreadPool pool(1);
  auto model = create_model_arch(file, pool);
  KvCache cache = model->make_cache(8, KvType::F16, KvType::F16);
  std::vector<float> logits(static_cast<size_t>(9 * model->config().n_vocab));
  const std::vector<int32_t> nine = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  try {
    model->forward(nine, cache, LogitsMode::All, logits.data());
    FAIL() << "no error";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("context length 8 exceeded"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cache.n_past(), 0);
  model->forward(std::span<const int32_t>(nine.data(), 7), cache, LogitsMode::Last, logits.data());
  model->forward(std::span<const int32_t>(nine.data(), 1), cache, LogitsMode::Last, logits.data());
  EXPECT_EQ(cache.n_past(), 8);
  EXPECT_THROW(model->forward(std::span<const int32_t>(nine.data(), 1), cache, LogitsMode::Last,
                              logits.data()),
               moe::Error);
  EXPECT_EQ(cache.n_past(), 8);
  // generate() checks the room for the prompt and all decode steps up front.
  cache.clear();
  GenerateOptions opt;
  opt.n_steps = 4;
  EXPECT_THROW(generate(*model, cache, std::span<const int32_t>(nine.data(), 6), opt), moe::Error);
  // Bad token ids are errors too, not crashes.
  const std::vector<int32_t> bad = {static_cast<int32_t>(model->config().n_vocab)};
  EXPECT_THROW(model->forward(bad, cache, LogitsMode::Last, logits.data()), moe::Error);
  fs::remove(path);
}

// A cache for a GPU model (KvStorage::None) keeps positions but no host K/V or recurrent state:
// every access to them is a clear error, and a CPU model refuses it instead of reading garbage.
TEST(KvCache, WithoutHostStorageCountsPositionsOnly) {
  const std::string path =
      (fs::temp_directory_path() / ("moe_model_kvnone_" + std::to_string(::getpid()) + ".gguf"))
          .string();
  moe::test::write_synth(path, {});
  const auto file = moe::gguf::GgufFile::open(path);
  moe::cpu::ThreadPool pool(1);
  auto model = create_model_arch(file, pool);
  const ModelConfig& cfg = model->config();
  EXPECT_EQ(model->make_cache(8, KvType::F16, KvType::F16).storage(), KvStorage::Host);
  KvCache c(cfg, 1 << 20, KvType::F16, KvType::F16, KvStorage::None);  // would be GBs on the host
  EXPECT_EQ(c.storage(), KvStorage::None);
  c.check_room(5);
  c.advance(5);
  EXPECT_EQ(c.n_past(), 5);
  EXPECT_FALSE(c.has_recurrent(0));
  std::vector<float> row(static_cast<size_t>(c.k_row_elems(0)), 1.0f);
  const auto expect_host_error = [](auto&& fn) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const moe::Error& e) {
      EXPECT_NE(std::string(e.what()).find("needs host storage"), std::string::npos) << e.what();
    }
  };
  expect_host_error([&] { c.store(0, 5, row.data(), row.data()); });
  expect_host_error([&] { c.read_k(0, 0, 1, row.data()); });
  expect_host_error([&] { (void)c.k_f32(0); });
  c.clear();
  EXPECT_EQ(c.n_past(), 0);
  std::vector<float> logits(static_cast<size_t>(cfg.n_vocab));
  const std::vector<int32_t> toks = {1, 2};
  expect_host_error([&] { model->forward(toks, c, LogitsMode::Last, logits.data()); });
  EXPECT_EQ(c.n_past(), 0);
  // Bad shapes are still checked without storage.
  EXPECT_THROW(KvCache(cfg, 0, KvType::F16, KvType::F16, KvStorage::None), moe::Error);
  fs::remove(path);
}

TEST(KvCache, TypeNames) {
  for (const char* n : {"f32", "f16", "bf16", "q8_0", "q5_0", "q5_1", "q4_0", "q4_1", "iq4_nl"}) {
    EXPECT_EQ(kv_type_name(parse_kv_type(n)), n);
  }
  EXPECT_EQ(kv_ggml_type(KvType::IQ4_NL), moe::GgmlType::IQ4_NL);
  EXPECT_TRUE(kv_type_quantized(KvType::IQ4_NL));
  EXPECT_THROW(parse_kv_type("iq4_xs"), moe::Error);
  EXPECT_THROW(parse_kv_type("F16"), moe::Error);
}

TEST(KvCache, StoresAndReadsBackEveryType) {
  ModelConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head_kv = {2, 2};
  cfg.head_dim_k = cfg.head_dim_v = 64;
  std::vector<float> k(128), v(128), out(128);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = std::sin(static_cast<float>(i) * 0.37f);
    v[i] = std::cos(static_cast<float>(i) * 0.11f) * 2;
  }
  for (KvType t : {KvType::F32, KvType::F16, KvType::BF16, KvType::Q8_0, KvType::Q5_0, KvType::Q5_1,
                   KvType::Q4_0, KvType::Q4_1, KvType::IQ4_NL}) {
    KvCache c(cfg, 4, t, t);
    c.store(1, 3, k.data(), v.data());
    // Quantized rows are stored rotated (64-value blocks at this head size) and read as stored.
    std::vector<float> want_k = k, want_v = v;
    EXPECT_EQ(c.k_rotation(1), kv_type_quantized(t) ? 64 : 0);
    EXPECT_EQ(c.v_rotation(1), kv_type_quantized(t) ? 64 : 0);
    if (c.k_rotation(1)) moe::cpu::hadamard_blocks(want_k.data(), 128, c.k_rotation(1));
    if (c.v_rotation(1)) moe::cpu::hadamard_blocks(want_v.data(), 128, c.v_rotation(1));
    c.read_k(1, 3, 1, out.data());
    // Bounds relative to the row's largest value: q8_0 rounds to amax/127 steps, 5-bit types to
    // about amax/16, 4-bit ones to about amax/8 (iq4_nl: at most 14.5 of its amax/127 steps).
    const auto bound = [&](const std::vector<float>& want) {
      float amax = 0;
      for (float x : want) amax = std::max(amax, std::fabs(x));
      switch (t) {
        case KvType::F32:
          return 0.0;
        case KvType::F16:
          return 1e-3 * amax;
        case KvType::BF16:
          return 4e-3 * amax;
        case KvType::Q8_0:
          return amax / 200.0;
        case KvType::Q5_0:
        case KvType::Q5_1:
          return amax / 14.0;
        default:  // 4-bit
          return amax / 7.0;
      }
    };
    const double tol_k = bound(want_k), tol_v = bound(want_v);
    for (size_t i = 0; i < k.size(); ++i) EXPECT_NEAR(out[i], want_k[i], tol_k) << kv_type_name(t);
    c.read_v(1, 3, 1, out.data());
    for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(out[i], want_v[i], tol_v) << kv_type_name(t);
    EXPECT_THROW(c.store(0, 4, k.data(), v.data()), moe::Error);
  }
}

// The CPU attention over an iq4_nl cache equals, bit for bit, the attention over an f32 cache
// holding that cache's decoded rows (the query rotated and the output rotated back as the
// attention does for a rotated cache), for a decode step and a prompt batch (the block path), and
// stays near the attention over the unquantized rows.
TEST(KvCache, Iq4NlAttentionMatchesItsDecodedRows) {
  ModelConfig cfg;
  cfg.n_layer = 1;
  cfg.n_head_kv = {2};
  cfg.head_dim_k = cfg.head_dim_v = 64;
  const AttentionShape s{4, 2, 64, 64, 0.125f};
  constexpr int64_t kCtx = 48, kRow = 128;
  std::mt19937 rng(4242);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  moe::cpu::ThreadPool pool(2);
  AttentionScratch scratch;
  for (const bool rotate : {false, true}) {
    SCOPED_TRACE(rotate ? "rotated" : "not rotated");
    KvConfig kv = KvConfig::uniform(KvType::IQ4_NL, KvType::IQ4_NL);
    kv.rotate = rotate;
    KvCache q4(cfg, kCtx, kv), decoded(cfg, kCtx, KvType::F32, KvType::F32),
        raw(cfg, kCtx, KvType::F32, KvType::F32);
    EXPECT_EQ(q4.k_rotation(0), rotate ? 64 : 0);
    EXPECT_EQ(q4.bytes(), 2u * kCtx * (kRow / 32) * 18);
    std::vector<float> k(kRow), v(kRow), dk(kRow), dv(kRow);
    for (int64_t p = 0; p < kCtx; ++p) {
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      q4.store(0, p, k.data(), v.data());
      raw.store(0, p, k.data(), v.data());
      q4.read_k(0, p, 1, dk.data());
      q4.read_v(0, p, 1, dv.data());
      decoded.store(0, p, dk.data(), dv.data());
    }
    for (const auto& [pos0, n_tokens] : {std::pair<int64_t, int64_t>{47, 1}, {8, 40}}) {
      SCOPED_TRACE("pos0 " + std::to_string(pos0) + ", " + std::to_string(n_tokens) + " tokens");
      std::vector<float> q(static_cast<size_t>(n_tokens * 4 * 64));
      for (float& x : q) x = normal(rng);
      std::vector<float> got(static_cast<size_t>(n_tokens * 4 * 64)), want(got.size()),
          exact(got.size());
      attention(s, q.data(), n_tokens, pos0, q4, 0, got.data(), pool, scratch);
      attention(s, q.data(), n_tokens, pos0, raw, 0, exact.data(), pool, scratch);
      std::vector<float> qr = q;
      if (rotate) moe::cpu::hadamard_blocks(qr.data(), static_cast<int64_t>(qr.size()), 64);
      attention(s, qr.data(), n_tokens, pos0, decoded, 0, want.data(), pool, scratch);
      if (rotate) moe::cpu::hadamard_blocks(want.data(), static_cast<int64_t>(want.size()), 64);
      EXPECT_EQ(got, want);
      double mx = 0;
      for (size_t i = 0; i < got.size(); ++i)
        mx = std::max(mx, std::fabs(static_cast<double>(got[i]) - exact[i]));
      EXPECT_GT(mx, 0.0);
      EXPECT_LT(mx, 0.5);
    }
  }
}

// -ctk-first / -ctv-last and friends: the first/last N attention layers (recurrent layers do not
// count) get their own type, "last" where both reach; the types and rotation follow per layer.
TEST(KvCache, PerLayerTypesCountAttentionLayersOnly) {
  ModelConfig cfg;
  cfg.n_layer = 8;
  cfg.n_head_kv = std::vector<int64_t>(8, 2);
  cfg.head_dim_k = cfg.head_dim_v = 64;
  cfg.recurrent = {1, 1, 1, 0, 1, 1, 1, 0};  // attention layers: 3 and 7
  KvConfig kv = KvConfig::uniform(KvType::Q4_0, KvType::Q4_0);
  kv.v_first = KvConfig::parse_override("q8_0,1", "-ctv-first");
  kv.k_last = KvConfig::parse_override("f16,1", "-ctk-last");
  KvCache c(cfg, 16, kv, KvStorage::None);
  EXPECT_EQ(c.k_type(3), KvType::Q4_0);
  EXPECT_EQ(c.v_type(3), KvType::Q8_0);
  EXPECT_EQ(c.k_type(7), KvType::F16);
  EXPECT_EQ(c.v_type(7), KvType::Q4_0);
  EXPECT_EQ(c.k_rotation(7), 0);  // f16 K is not rotated
  EXPECT_EQ(c.v_rotation(7), 64);
  // Row bytes at the real types: q4_0 is 18 bytes per 32 values, q8_0 34, f16 64.
  EXPECT_EQ(c.bytes(), 16u * (4 * 18 + 4 * 34 + 128 * 2 + 4 * 18));
  EXPECT_NE(c.describe().find("layers 3-3 K q4_0 V q8_0"), std::string::npos) << c.describe();
  EXPECT_NE(c.describe().find("layers 7-7 K f16 V q4_0"), std::string::npos) << c.describe();
  // Both ends reaching every layer: "last" wins.
  KvConfig both = KvConfig::uniform(KvType::F16, KvType::F16);
  both.k_first = KvConfig::parse_override("q8_0,2", "-ctk-first");
  both.k_last = KvConfig::parse_override("q4_0,2", "-ctk-last");
  KvCache d(cfg, 16, both, KvStorage::None);
  EXPECT_EQ(d.k_type(3), KvType::Q4_0);
  EXPECT_EQ(d.k_type(7), KvType::Q4_0);
  // --no-kv-rotation.
  kv.rotate = false;
  KvCache e(cfg, 16, kv, KvStorage::None);
  EXPECT_EQ(e.k_rotation(3), 0);
  EXPECT_EQ(e.v_rotation(7), 0);
}

TEST(KvCache, PerLayerOverrideSpellingsAreChecked) {
  for (const char* bad : {"q8_0", "q8_0,", "q8_0,-1", "q8_0,x", "q8_0,4x", "iq4_xs,4", ",4"}) {
    try {
      (void)KvConfig::parse_override(bad, "-ctv-first");
      ADD_FAILURE() << bad;
    } catch (const moe::Error& e) {
      EXPECT_NE(std::string(e.what()).find("-ctv-first"), std::string::npos) << e.what();
    }
  }
  const KvConfig::Override o = KvConfig::parse_override("q8_0,4", "-ctv-first");
  EXPECT_EQ(o.type, KvType::Q8_0);
  EXPECT_EQ(o.n_layers, 4);
}

}  // namespace

namespace prompt_cache {

std::vector<float> last_logits(ModelArch& model, KvCache& cache, std::span<const int32_t> tokens,
                               const ForwardHooks* hooks) {
  std::vector<float> row(static_cast<size_t>(model.config().n_vocab));
  model.forward(tokens, cache, LogitsMode::Last, row.data(), hooks);
  return row;
}

// The prompt cache keeps a prefix of an earlier sequence (KvCache::truncate) and evaluates only
// the rest. With routing forced to the golden experts its logits are those of a cold one-batch
// evaluation within the F16 model's bounds, and exactly those of a cold evaluation split at the
// same place: the rows of the discarded tokens leave no trace.
TEST(KvCache, PromptCachePrefixEvaluatesLikeAColdPrompt) {
  const fs::path root = moe::test::testdata_dir();
  const auto file = moe::gguf::GgufFile::open((root / "models/tiny-qwen3moe-sv-F16.gguf").string());
  moe::cpu::ThreadPool pool(1);
  auto model = create_model_arch(file, pool);
  const fs::path dir = root / "golden/tiny-qwen3moe-sv-F16/chat";
  const auto prompt = moe::test::read_raw<int32_t>(dir / "prompt_tokens.i32");
  ForcedRouting forced(dir.string(), model->config().n_layer, model->config().n_expert_used);
  const ForwardHooks hooks = forced.hooks();
  const std::span<const int32_t> all(prompt);
  const size_t k = prompt.size() / 2;
  ASSERT_GT(k, 4u);

  KvCache cold = model->make_cache(256, KvType::F16, KvType::F16);
  const std::vector<float> one_batch = last_logits(*model, cold, all, &hooks);

  KvCache split = model->make_cache(256, KvType::F16, KvType::F16);
  last_logits(*model, split, all.first(k), &hooks);
  const std::vector<float> two_batches = last_logits(*model, split, all.subspan(k), &hooks);

  // An earlier conversation that went elsewhere after the first k tokens.
  KvCache reused = model->make_cache(256, KvType::F16, KvType::F16);
  last_logits(*model, reused, all.first(k), &hooks);
  std::vector<int32_t> other(all.rbegin(), all.rbegin() + 7);
  last_logits(*model, reused, other, &hooks);
  ASSERT_TRUE(reused.can_truncate_to(static_cast<int64_t>(k)));
  reused.truncate(static_cast<int64_t>(k));
  EXPECT_EQ(reused.n_past(), static_cast<int64_t>(k));
  const std::vector<float> cached = last_logits(*model, reused, all.subspan(k), &hooks);

  ASSERT_EQ(cached.size(), one_batch.size());
  double mx = 0, ss = 0;
  for (size_t i = 0; i < cached.size(); ++i) {
    EXPECT_EQ(cached[i], two_batches[i]) << "logit " << i;
    const double d = static_cast<double>(cached[i]) - one_batch[i];
    mx = std::max(mx, std::fabs(d));
    ss += d * d;
  }
  EXPECT_LE(mx, 0.05);
  EXPECT_LE(std::sqrt(ss / static_cast<double>(cached.size())), 0.01);
  std::printf("[prompt-cache] vs one batch: max %.2g rms %.2g\n", mx,
              std::sqrt(ss / static_cast<double>(cached.size())));
}

// A recurrent state holds every position it saw: a hybrid model's cache keeps all or none.
TEST(KvCache, RecurrentStateCannotBeRewound) {
  const auto file = moe::gguf::GgufFile::open(
      (moe::test::qwen35moe_testdata_dir() / "models/tiny-qwen35moe-sv-F16.gguf").string());
  moe::cpu::ThreadPool pool(1);
  auto model = create_model_arch(file, pool);
  KvCache cache = model->make_cache(64, KvType::F16, KvType::F16);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6};
  last_logits(*model, cache, tokens, nullptr);
  EXPECT_FALSE(cache.can_truncate_to(3));
  EXPECT_THROW(cache.truncate(3), moe::Error);
  EXPECT_EQ(cache.n_past(), 6);
  EXPECT_TRUE(cache.can_truncate_to(6));
  cache.truncate(6);
  EXPECT_EQ(cache.n_past(), 6);
  EXPECT_FALSE(cache.can_truncate_to(7));
  cache.truncate(0);
  EXPECT_EQ(cache.n_past(), 0);
}

// The prompt cache's checkpoint: a hybrid model's sequence goes back to the state it had at the
// checkpoint, whatever it evaluated after; from there a different continuation gives exactly the
// logits of a cold evaluation split at the same place. A truncation before the checkpoint, or a
// cleared cache, loses it.
TEST(KvCache, RecurrentCheckpointResumesLikeAColdSequence) {
  const auto file = moe::gguf::GgufFile::open(
      (moe::test::qwen35moe_testdata_dir() / "models/tiny-qwen35moe-sv-F16.gguf").string());
  moe::cpu::ThreadPool pool(1);
  auto model = create_model_arch(file, pool);
  const std::vector<int32_t> head = {11, 12, 13, 14, 15, 16, 17, 18};
  const std::vector<int32_t> went = {21, 22, 23}, goes = {31, 32, 33, 34};

  KvCache cold = model->make_cache(64, KvType::Q8_0, KvType::Q8_0);
  last_logits(*model, cold, head, nullptr);
  const std::vector<float> want = last_logits(*model, cold, goes, nullptr);

  KvCache c = model->make_cache(64, KvType::Q8_0, KvType::Q8_0);
  EXPECT_EQ(c.checkpoint_pos(), -1);
  EXPECT_THROW(c.restore_checkpoint(), moe::Error);
  last_logits(*model, c, head, nullptr);
  model->save_checkpoint(c);
  EXPECT_EQ(c.checkpoint_pos(), 8);
  last_logits(*model, c, went, nullptr);
  ASSERT_TRUE(model->restore_checkpoint(c));
  EXPECT_EQ(c.n_past(), 8);
  EXPECT_EQ(last_logits(*model, c, goes, nullptr), want);
  // Back to it again after more: the checkpoint stays until something before it is dropped.
  ASSERT_TRUE(model->restore_checkpoint(c));
  EXPECT_EQ(last_logits(*model, c, goes, nullptr), want);
  c.truncate(0);
  EXPECT_EQ(c.checkpoint_pos(), -1);
}

}  // namespace prompt_cache
