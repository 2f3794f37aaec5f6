// RemoteExpertExecutor computes what the in-process CpuExpertExecutor computes: model logits over a
// prompt and decode steps bit for bit (f32 and q8_0 weights), and batches larger than the segment,
// split into several requests, up to rounding.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "experts/cpu_expert_executor.h"
#include "kernels/cpu/cpu_features.h"
#include "tests/worker/worker_test_util.h"

namespace {

using namespace moe::model;
using moe::GgmlType;
using moe::test::worker_options;

// Logits of a 12-token prompt (every row) followed by 4 greedy decode steps.
std::vector<float> prompt_and_decode(ModelArch& m) {
  KvCache cache = m.make_cache(64, KvType::F32, KvType::F32);
  const std::vector<int32_t> prompt = {1, 5, 9, 14, 22, 31, 40, 47, 58, 63, 77, 90};
  std::vector<float> all = evaluate_batch(m, cache, prompt);
  const auto n_vocab = static_cast<size_t>(m.config().n_vocab);
  std::vector<float> row(all.end() - static_cast<std::ptrdiff_t>(n_vocab), all.end());
  for (int step = 0; step < 4; ++step) {
    const int32_t tok = argmax(row);
    m.forward(std::span<const int32_t>(&tok, 1), cache, LogitsMode::Last, row.data());
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

void expect_bitwise_equal(const std::vector<float>& want, const std::vector<float>& got) {
  ASSERT_EQ(want.size(), got.size());
  size_t diff = 0;
  for (size_t i = 0; i < want.size(); ++i)
    diff += std::memcmp(&want[i], &got[i], sizeof(float)) != 0;
  EXPECT_EQ(diff, 0u) << "of " << want.size() << " values";
}

// Split batches are equal up to rounding: the kernels' accumulation order depends on how many rows
// share an expert in one call (vec_dot keeps 4, 2 or 1 accumulator chains for 1-2, 3-6, 7-8 rows),
// and a split changes those counts. Measured: <= 1.1e-6 on logits of magnitude 4.7.
void expect_close(const std::vector<float>& want, const std::vector<float>& got) {
  ASSERT_EQ(want.size(), got.size());
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f * scale) << "value " << i;
  }
}

void logits_match(GgmlType wtype, int64_t max_tokens, int64_t max_items, bool exact) {
  const std::string path = moe::test::synth_model(wtype);
  const auto file = moe::gguf::GgufFile::open(path);
  moe::cpu::ThreadPool pool(moe::test::kThreads);
  const std::vector<float> want = prompt_and_decode(*create_model_arch(file, pool));

  RemoteExpertOptions opt = worker_options(path);
  opt.max_tokens = max_tokens;
  opt.max_items = max_items;
  auto remote = std::make_unique<RemoteExpertExecutor>(opt);
  const pid_t worker = remote->worker_pid();
  auto model = create_model_arch(file, pool, std::move(remote));
  const std::vector<float> got = prompt_and_decode(*model);
  if (exact) {
    expect_bitwise_equal(want, got);
  } else {
    expect_close(want, got);
  }

  model.reset();  // SHUTDOWN: the worker is gone and reaped, the segment unlinked
  EXPECT_EQ(::kill(worker, 0), -1);
  EXPECT_EQ(errno, ESRCH);
  EXPECT_TRUE(moe::test::our_segments().empty());
}

// Same kernels on the same batches, so bit for bit.
TEST(RemoteExecutor, LogitsEqualInProcessF32) { logits_match(GgmlType::F32, 64, 128, true); }

TEST(RemoteExecutor, LogitsEqualInProcessQ8_0) { logits_match(GgmlType::Q8_0, 64, 128, true); }

// The 12-token prompt goes out in requests of at most 3 tokens (6 of at most 7 items).
TEST(RemoteExecutor, ChunkedPromptMatchesInProcess) {
  logits_match(GgmlType::F32, 3, 7, false);
  logits_match(GgmlType::Q8_0, 3, 7, false);
}

struct Batch {
  std::vector<float> x;
  std::vector<ExpertItem> items;
};

// n_tokens rows; token t gets t % 4 items (some none), the items of all tokens interleaved.
Batch random_batch(int64_t n_tokens, int64_t n_embd, int64_t n_expert, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  Batch b;
  b.x.resize(static_cast<size_t>(n_tokens * n_embd));
  for (float& v : b.x) v = val(rng);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t k = 0; k < t % 4; ++k) {
      b.items.push_back(
          {static_cast<int32_t>(t), static_cast<int32_t>(rng() % n_expert), val(rng)});
    }
  }
  std::shuffle(b.items.begin(), b.items.end(), rng);
  return b;
}

TEST(RemoteExecutor, LargeBatchIsSplitAndMatchesOneCall) {
  const std::string path = moe::test::synth_model(GgmlType::F32);
  const auto file = moe::gguf::GgufFile::open(path);
  const auto cfg = ModelConfig::from_gguf(file);
  const int64_t E = cfg.n_embd, n_tokens = 23;
  moe::cpu::ThreadPool pool(moe::test::kThreads);
  std::vector<ExpertLayerTensors> layers;
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    layers.push_back(require_expert_tensors(file, l, E, cfg.n_ff_exp, cfg.n_expert));
  }
  CpuExpertExecutor local(layers, E, cfg.n_ff_exp, cfg.n_expert, pool, moe::cpu::best_isa());

  RemoteExpertOptions opt = worker_options(path);
  opt.max_tokens = 4;
  opt.max_items = 5;
  RemoteExpertExecutor remote(opt);
  for (int64_t layer = 0; layer < cfg.n_layer; ++layer) {
    const Batch b = random_batch(n_tokens, E, cfg.n_expert, static_cast<uint32_t>(layer));
    std::vector<float> want(static_cast<size_t>(n_tokens * E)), got(want.size(), 7.0f);
    local.run(layer, b.x.data(), n_tokens, b.items, want.data());
    remote.run(layer, b.x.data(), n_tokens, b.items, got.data());
    expect_close(want, got);
  }

  // Each expert used once: every expert sees the same single row whether split or not, so the
  // split result is bitwise that of one call (this checks the split's bookkeeping exactly).
  {
    Batch b = random_batch(6, E, cfg.n_expert, 7);
    b.items.clear();
    for (int32_t t = 5; t >= 0; --t) b.items.push_back({t, (t + 2) % 6, 0.5f + 0.1f * t});
    std::vector<float> want(static_cast<size_t>(6 * E)), got(want.size());
    local.run(1, b.x.data(), 6, b.items, want.data());
    remote.run(1, b.x.data(), 6, b.items, got.data());
    expect_bitwise_equal(want, got);
  }
  // One token with more items than a request holds: its sum is also computed in parts.
  Batch b = random_batch(2, E, cfg.n_expert, 99);
  b.items.clear();
  for (int k = 0; k < 12; ++k) b.items.push_back({1, k % 6, 0.1f * static_cast<float>(k + 1)});
  std::vector<float> want(static_cast<size_t>(2 * E)), got(want.size());
  local.run(0, b.x.data(), 2, b.items, want.data());
  remote.run(0, b.x.data(), 2, b.items, got.data());
  expect_close(want, got);
}

}  // namespace
