// CpuForward::forward_batch (continuous batching) on the tiny qwen3moe and qwen35moe models:
//  * three sequences in different states (a decode token, a fresh prompt, a continuation) in one
//    pass over the layers give each chunk's last-token logits as separate forward() calls on
//    copies of the same sequences do, advance every cache by its chunk, and leave K/V and
//    recurrent state from which single forwards continue alike; a second batch in another order;
//  * a Q4_0 K/V cache; decode batches allocate nothing;
//  * refused batches (a cache twice, a bad token id in a later chunk, a chunk that overflows its
//    cache) throw before anything runs, and a batch that fails midway leaves every cache as it was.
// Logits are compared within a bound relative to their scale: a batched and a one-row matmul sum
// in different orders, and with F16 weights a last-bit difference may flip the F16 rounding of an
// activation (measured up to 6.2e-4 relative on AVX2/AVX-512; K-quants 4e-7; scalar kernels 0).
// Wrong positions or state move logits by >= 0.35 (testdata-qwen35moe README §9). Measured
// differences print as [forward-batch].
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/model/model_arch.h"
#include "experts/cpu_expert_executor.h"
#include "experts/model_config.h"
#include "experts/tensor_table.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/model/alloc_counter.h"
#include "tests/testdata.h"

namespace {

using namespace moe::model;
using Tokens = std::vector<int32_t>;

constexpr int64_t kCtx = 64;
// max |batched - separate| <= kRelTol * max |separate logit|, per row.
constexpr double kRelTol = 1e-3;

std::string model_path(const std::string& arch, const std::string& quant) {
  const auto dir =
      arch == "qwen3moe" ? moe::test::testdata_dir() : moe::test::qwen35moe_testdata_dir();
  return (dir / "models" / ("tiny-" + arch + "-sv-" + quant + ".gguf")).string();
}

// The CPU executor, counting its runs (one per layer and forward pass), so that a test sees how
// many passes a batch took and whether anything ran at all; fail_at makes that run throw.
class CountingExperts final : public ExpertExecutor {
 public:
  CountingExperts(std::unique_ptr<ExpertExecutor> inner, int64_t& runs, int64_t& fail_at)
      : inner_(std::move(inner)), runs_(runs), fail_at_(fail_at) {}
  void run(int64_t layer, const float* x, int64_t n_tokens, std::span<const ExpertItem> items,
           float* out) override {
    if (++runs_ == fail_at_) throw moe::Error("injected expert failure");
    inner_->run(layer, x, n_tokens, items, out);
  }

 private:
  std::unique_ptr<ExpertExecutor> inner_;
  int64_t& runs_;
  int64_t& fail_at_;
};

struct Harness {
  explicit Harness(const std::string& arch, const std::string& quant)
      : name(arch + "/" + quant), file(moe::gguf::GgufFile::open(model_path(arch, quant))) {
    const ModelConfig cfg = ModelConfig::from_gguf(file);
    std::vector<ExpertLayerTensors> layers;
    for (int64_t l = 0; l < cfg.n_layer; ++l) {
      layers.push_back(require_expert_tensors(file, l, cfg.n_embd, cfg.n_ff_exp, cfg.n_expert));
    }
    auto cpu = std::make_unique<CpuExpertExecutor>(std::move(layers), cfg.n_embd, cfg.n_ff_exp,
                                                   cfg.n_expert, pool, moe::cpu::best_isa());
    model = create_model_arch(file, pool,
                              std::make_unique<CountingExperts>(std::move(cpu), runs, fail_at));
    EXPECT_EQ(model->name(), arch);
    V = model->config().n_vocab;
    n_layer = model->config().n_layer;
  }

  Tokens tokens(std::mt19937& rng, int n) const {
    std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(V - 1));
    Tokens t(static_cast<size_t>(n));
    for (auto& x : t) x = d(rng);
    return t;
  }
  // The last token's logits of a separate forward().
  std::vector<float> last_logits(const Tokens& t, KvCache& cache) {
    std::vector<float> out(static_cast<size_t>(V));
    model->forward(t, cache, LogitsMode::Last, out.data());
    return out;
  }

  std::string name;
  moe::gguf::GgufFile file;
  // Two threads: the row-offset pointers go through the pool's split of every kernel.
  moe::cpu::ThreadPool pool{2};
  int64_t runs = 0, fail_at = -1;
  std::unique_ptr<ModelArch> model;
  int64_t V = 0, n_layer = 0;
};

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}
double max_abs(const float* a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i])));
  return m;
}

// Row `got` against the separately evaluated `want`.
void expect_close(const Harness& h, const float* got, const std::vector<float>& want,
                  const std::string& what) {
  const double scale = max_abs(want.data(), h.V);
  const double diff = max_abs_diff(got, want.data(), h.V);
  std::printf("[forward-batch] %-16s %-28s max diff %.3g (max |logit| %.3g, rel %.3g)\n",
              h.name.c_str(), what.c_str(), diff, scale, diff / scale);
  EXPECT_GT(scale, 0.0) << what;
  EXPECT_LE(diff, kRelTol * scale) << what;
}

// Three sequences A (7 tokens, gets 1), B (fresh, gets 6), C (3 tokens, gets 4) in one batch,
// then {C, A} in another, then a single forward on each, all against copies of the sequences
// evaluated with forward() alone.
void check_three_sequences(Harness& h, KvType kv, uint32_t seed) {
  SCOPED_TRACE(h.name);
  std::mt19937 rng(seed);
  const auto V = static_cast<size_t>(h.V);
  KvCache a = h.model->make_cache(kCtx, kv, kv), b = a, c = a;
  h.last_logits(h.tokens(rng, 7), a);
  h.last_logits(h.tokens(rng, 3), c);
  ASSERT_EQ(a.n_past(), 7);
  ASSERT_EQ(b.n_past(), 0);
  ASSERT_EQ(c.n_past(), 3);
  // The same sequences, continued by separate forwards only.
  KvCache ra = a, rb = b, rc = c;

  // 1. {A, B, C}: a decode token beside a prompt and a continuation, in one pass.
  const Tokens ta = h.tokens(rng, 1), tb = h.tokens(rng, 6), tc = h.tokens(rng, 4);
  const SequenceChunk batch1[] = {{ta, &a}, {tb, &b}, {tc, &c}};
  std::vector<float> got(3 * V);
  int64_t runs0 = h.runs;
  h.model->forward_batch(batch1, got.data());
  EXPECT_EQ(h.runs - runs0, h.n_layer) << "not one pass over the layers";
  EXPECT_EQ(a.n_past(), 8);
  EXPECT_EQ(b.n_past(), 6);
  EXPECT_EQ(c.n_past(), 7);
  const std::vector<float> wa = h.last_logits(ta, ra), wb = h.last_logits(tb, rb),
                           wc = h.last_logits(tc, rc);
  expect_close(h, got.data(), wa, "batch1 A (7+1)");
  expect_close(h, got.data() + V, wb, "batch1 B (0+6)");
  expect_close(h, got.data() + 2 * V, wc, "batch1 C (3+4)");
  // Rows of different sequences differ far beyond the bound, so a row mix-up cannot pass.
  EXPECT_GT(max_abs_diff(wa.data(), wc.data(), h.V), 10 * kRelTol * max_abs(wa.data(), h.V));
  EXPECT_GT(max_abs_diff(wb.data(), wc.data(), h.V), 10 * kRelTol * max_abs(wb.data(), h.V));

  // 2. {C, A}: another order, C decoding and A taking 3 tokens.
  const Tokens tc2 = h.tokens(rng, 1), ta2 = h.tokens(rng, 3);
  const SequenceChunk batch2[] = {{tc2, &c}, {ta2, &a}};
  runs0 = h.runs;
  h.model->forward_batch(batch2, got.data());
  EXPECT_EQ(h.runs - runs0, h.n_layer);
  EXPECT_EQ(c.n_past(), 8);
  EXPECT_EQ(a.n_past(), 11);
  EXPECT_EQ(b.n_past(), 6);
  expect_close(h, got.data(), h.last_logits(tc2, rc), "batch2 C (7+1)");
  expect_close(h, got.data() + V, h.last_logits(ta2, ra), "batch2 A (8+3)");

  // 3. Single forwards continue from what the batches stored (K/V and recurrent state).
  struct Pair {
    KvCache *batched, *separate;
    const char* tag;
  };
  for (const Pair& p : {Pair{&a, &ra, "A"}, Pair{&b, &rb, "B"}, Pair{&c, &rc, "C"}}) {
    const Tokens t = h.tokens(rng, 1);
    const int64_t n0 = p.batched->n_past();
    const std::vector<float> g = h.last_logits(t, *p.batched);
    EXPECT_EQ(p.batched->n_past(), n0 + 1);
    expect_close(h, g.data(), h.last_logits(t, *p.separate), std::string("then single ") + p.tag);
  }
}

TEST(ForwardBatch, Qwen3MoeF16) {
  Harness h("qwen3moe", "F16");
  check_three_sequences(h, KvType::F16, 11);
}

TEST(ForwardBatch, Qwen3MoeQ4KM) {
  Harness h("qwen3moe", "Q4_K_M");
  check_three_sequences(h, KvType::F16, 12);
}

TEST(ForwardBatch, Qwen35MoeF16) {
  Harness h("qwen35moe", "F16");
  check_three_sequences(h, KvType::F16, 13);
}

TEST(ForwardBatch, Qwen35MoeQ4KM) {
  Harness h("qwen35moe", "Q4_K_M");
  check_three_sequences(h, KvType::F16, 14);
}

// Quantized (and Hadamard-rotated) K/V rows stored by the batch, read by each chunk's attention.
TEST(ForwardBatch, Q4_0KvCache) {
  Harness h("qwen3moe", "Q4_K_M");
  check_three_sequences(h, KvType::Q4_0, 15);
}

// Refused batches throw moe::Error before any layer runs and leave every cache as it was.
TEST(ForwardBatch, RefusedBeforeAnythingRuns) {
  for (const char* arch : {"qwen3moe", "qwen35moe"}) {
    Harness h(arch, "F16");
    SCOPED_TRACE(h.name);
    std::mt19937 rng(21);
    KvCache a = h.model->make_cache(kCtx, KvType::F16, KvType::F16), b = a;
    h.last_logits(h.tokens(rng, 5), a);
    const Tokens t1 = h.tokens(rng, 2), t2 = h.tokens(rng, 3);
    std::vector<float> out(static_cast<size_t>(3 * h.V));
    const int64_t runs0 = h.runs;

    // One cache in two chunks.
    const SequenceChunk twice[] = {{t1, &a}, {t2, &a}};
    EXPECT_THROW(h.model->forward_batch(twice, out.data()), moe::Error);
    EXPECT_EQ(a.n_past(), 5);

    // A token id out of range in the second chunk: neither cache moves.
    Tokens bad = t2;
    bad[1] = static_cast<int32_t>(h.V);
    const SequenceChunk bad_token[] = {{t1, &a}, {bad, &b}};
    EXPECT_THROW(h.model->forward_batch(bad_token, out.data()), moe::Error);
    EXPECT_EQ(a.n_past(), 5);
    EXPECT_EQ(b.n_past(), 0);

    // The third chunk overflows its cache (2 of 4 positions used, 3 more asked).
    KvCache small = h.model->make_cache(4, KvType::F16, KvType::F16);
    h.last_logits(h.tokens(rng, 2), small);
    const int64_t runs1 = h.runs;
    const SequenceChunk overflow[] = {{t1, &a}, {t1, &b}, {t2, &small}};
    EXPECT_THROW(h.model->forward_batch(overflow, out.data()), moe::Error);
    EXPECT_EQ(a.n_past(), 5);
    EXPECT_EQ(b.n_past(), 0);
    EXPECT_EQ(small.n_past(), 2);
    EXPECT_EQ(h.runs, runs1) << "a refused batch ran layers";
    EXPECT_EQ(runs0 + h.n_layer, runs1) << "only the small cache's prompt ran";

    // No chunks, or a chunk without a cache.
    EXPECT_THROW(h.model->forward_batch({}, out.data()), moe::Error);
    const SequenceChunk no_cache[] = {{t1, &a}, {t2, nullptr}};
    EXPECT_THROW(h.model->forward_batch(no_cache, out.data()), moe::Error);

    // qwen35moe: a later chunk's cache without recurrent state (as a GPU forward's, which keeps
    // its state in VRAM) is refused too.
    if (std::string(arch) == "qwen35moe") {
      KvCache stateless(h.model->config(), kCtx, KvConfig::uniform(KvType::F16, KvType::F16),
                        KvStorage::None);
      const SequenceChunk foreign[] = {{t1, &a}, {t2, &stateless}};
      EXPECT_THROW(h.model->forward_batch(foreign, out.data()), moe::Error);
      EXPECT_EQ(stateless.n_past(), 0);
    }
    EXPECT_EQ(h.runs, runs1);
    EXPECT_EQ(a.n_past(), 5);
  }
}

// A batch that throws midway (here: the routed experts of its second layer) leaves every cache as
// it was, recurrent state included: the same batch then gives what separate forwards give.
TEST(ForwardBatch, FailureMidwayLeavesEveryCache) {
  for (const char* arch : {"qwen3moe", "qwen35moe"}) {
    Harness h(arch, "F16");
    SCOPED_TRACE(h.name);
    std::mt19937 rng(31);
    const auto V = static_cast<size_t>(h.V);
    KvCache a = h.model->make_cache(kCtx, KvType::F16, KvType::F16), b = a;
    h.last_logits(h.tokens(rng, 4), a);
    h.last_logits(h.tokens(rng, 2), b);
    KvCache ra = a, rb = b;
    const Tokens ta = h.tokens(rng, 3), tb = h.tokens(rng, 1);
    const SequenceChunk batch[] = {{ta, &a}, {tb, &b}};
    std::vector<float> got(2 * V);

    h.fail_at = h.runs + 2;
    EXPECT_THROW(h.model->forward_batch(batch, got.data()), moe::Error);
    EXPECT_EQ(h.runs, h.fail_at) << "the injected failure did not happen";
    EXPECT_EQ(a.n_past(), 4);
    EXPECT_EQ(b.n_past(), 2);

    h.fail_at = -1;
    h.model->forward_batch(batch, got.data());
    EXPECT_EQ(a.n_past(), 7);
    EXPECT_EQ(b.n_past(), 3);
    expect_close(h, got.data(), h.last_logits(ta, ra), "after failure A (4+3)");
    expect_close(h, got.data() + V, h.last_logits(tb, rb), "after failure B (2+1)");
  }
}

// Steady-state decode batches (one token of each of three sequences) allocate nothing: the
// scratch is grow-only and the prefill batch before them was larger.
TEST(ForwardBatch, DecodeBatchAllocatesNothing) {
  for (const char* arch : {"qwen3moe", "qwen35moe"}) {
    Harness h(arch, "Q4_K_M");
    SCOPED_TRACE(h.name);
    std::mt19937 rng(41);
    const int64_t at_start = moe::test::allocation_count();
    KvCache a = h.model->make_cache(kCtx, KvType::F16, KvType::F16), b = a, c = a;
    EXPECT_GT(moe::test::allocation_count(), at_start) << "the counter counts nothing";
    // Attention's decoded K/V rows grow with the context: a longer sequence sizes them first.
    KvCache warm = a;
    h.last_logits(h.tokens(rng, 24), warm);
    const Tokens pa = h.tokens(rng, 5), pb = h.tokens(rng, 2), pc = h.tokens(rng, 3);
    const SequenceChunk prefill[] = {{pa, &a}, {pb, &b}, {pc, &c}};
    std::vector<float> out(static_cast<size_t>(3 * h.V));
    h.model->forward_batch(prefill, out.data());
    const Tokens steps = h.tokens(rng, 3 * 9);
    const auto step = [&](size_t s) {
      const std::span<const int32_t> t(steps);
      const SequenceChunk decode[] = {
          {t.subspan(3 * s, 1), &a}, {t.subspan(3 * s + 1, 1), &b}, {t.subspan(3 * s + 2, 1), &c}};
      h.model->forward_batch(decode, out.data());
    };
    step(0);
    const int64_t before = moe::test::allocation_count();
    for (size_t s = 1; s < 9; ++s) step(s);
    EXPECT_EQ(moe::test::allocation_count() - before, 0);
    EXPECT_EQ(a.n_past(), 5 + 9);
    EXPECT_EQ(b.n_past(), 2 + 9);
  }
}

}  // namespace
