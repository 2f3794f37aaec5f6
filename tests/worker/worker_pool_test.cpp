// WorkerPoolExperts: several CPU worker processes share a layer's experts (expert e on worker
// e mod n) and compute at once; the model's logits match the in-process executor up to the
// rounding of adding per-worker partial sums. A killed worker fails the request with
// WorkerUnavailable and ensure_ready() starts it again under the same name.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>

#include "coordinator/engine/worker_pool_experts.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "tests/worker/worker_test_util.h"

namespace {

using namespace moe::model;
using moe::GgmlType;

std::vector<float> logits_of(ModelArch& m) {
  KvCache cache = m.make_cache(64, KvType::F32, KvType::F32);
  const std::vector<int32_t> prompt = {1, 5, 9, 14, 22, 31, 40, 47, 58, 63, 77, 90};
  std::vector<float> all = evaluate_batch(m, cache, prompt);
  const auto n_vocab = static_cast<size_t>(m.config().n_vocab);
  std::vector<float> row(all.end() - static_cast<std::ptrdiff_t>(n_vocab), all.end());
  for (int step = 0; step < 3; ++step) {
    const int32_t tok = argmax(row);
    m.forward(std::span<const int32_t>(&tok, 1), cache, LogitsMode::Last, row.data());
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

moe::engine::WorkerPoolOptions pool_options(const std::string& path, int n_workers) {
  moe::engine::WorkerPoolOptions o;
  o.base = moe::test::worker_options(path);
  for (int i = 0; i < n_workers; ++i) {
    moe::placement::CpuWorkerSpec w;
    w.id = "cpu-" + std::to_string(i);
    w.threads = 1;
    o.workers.push_back(w);
  }
  return o;  // no coordinator address: the workers do not register over gRPC here
}

TEST(WorkerPool, TwoWorkersMatchInProcessUpToRounding) {
  const std::string path = moe::test::synth_model(GgmlType::Q8_0);
  const auto file = moe::gguf::GgufFile::open(path);
  moe::cpu::ThreadPool pool(moe::test::kThreads);
  const std::vector<float> want = logits_of(*create_model_arch(file, pool));

  moe::engine::WorkerRegistry registry;
  auto experts = std::make_unique<moe::engine::WorkerPoolExperts>(pool_options(path, 2), registry);
  ASSERT_EQ(experts->size(), 2u);
  auto model = create_model_arch(file, pool, std::move(experts));
  const std::vector<float> got = logits_of(*model);
  ASSERT_EQ(got.size(), want.size());
  float scale = 0, worst = 0;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  EXPECT_LE(worst, 1e-5f * scale);
  EXPECT_EQ(registry.snapshot().size(), 2u);
  model.reset();
  EXPECT_TRUE(moe::test::our_segments().empty());
}

TEST(WorkerPool, KilledWorkerIsUnavailableThenRestarted) {
  const std::string path = moe::test::synth_model(GgmlType::F32);
  const auto cfg = ModelConfig::from_gguf(moe::gguf::GgufFile::open(path));
  moe::engine::WorkerRegistry registry;
  moe::engine::WorkerPoolExperts experts(pool_options(path, 2), registry);
  std::vector<float> x(static_cast<size_t>(cfg.n_embd), 0.25f), out(x.size());
  const std::vector<ExpertItem> items = {{0, 0, 0.5f}, {0, 1, 0.5f}};  // one expert per worker
  experts.run(0, x.data(), 1, items, out.data());
  const std::vector<float> first = out;

  const std::vector<pid_t> pids = experts.worker_pids();
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  const std::string msg =
      moe::test::error_of([&] { experts.run(0, x.data(), 1, items, out.data()); });
  EXPECT_NE(msg.find("CPU worker cpu-1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("started again"), std::string::npos) << msg;

  experts.ensure_ready();
  const std::vector<pid_t> after = experts.worker_pids();
  EXPECT_EQ(after[0], pids[0]);  // the survivor is kept
  EXPECT_NE(after[1], pids[1]);
  experts.run(0, x.data(), 1, items, out.data());
  EXPECT_EQ(out, first);
  for (const auto& w : registry.snapshot()) EXPECT_EQ(w.restarts, w.id == "cpu-1" ? 1u : 0u);
}

}  // namespace
