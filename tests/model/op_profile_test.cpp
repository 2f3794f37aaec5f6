// OpProfile (moe-bench --op-profile): the table's arithmetic, and the CPU forwards of both tiny
// models timing every op they run, once per layer of the right kind, only while the profile is
// active, with the weight bytes of the products, and logits unchanged by profiling.
#include "coordinator/model/op_profile.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "coordinator/model/model_arch.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/testdata.h"

namespace moe::model {
namespace {

TEST(OpProfile, TablesTimePerTokenAndBandwidth) {
  OpProfile p;
  p.set_active(true);
  p.add(Op::kAttnProj, 3000.0, 6'000'000);  // 3 ms, 6 MB: 2 GB/s
  p.add(Op::kAttnProj, 1000.0, 2'000'000);
  p.add(Op::kNorm, 4000.0, 0);
  p.count_tokens(4);
  const std::string t = p.table();
  EXPECT_NE(t.find("| attn q/k/v proj | 2 | 1.000 | 50.0% | 2.0 |"), std::string::npos) << t;
  EXPECT_NE(t.find("| norms | 1 | 1.000 | 50.0% | — |"), std::string::npos) << t;
  EXPECT_NE(t.find("| all | | 2.000 | 100% | |"), std::string::npos) << t;
  EXPECT_EQ(t.find("embed"), std::string::npos) << "an op that never ran has no row";
  p.reset();
  EXPECT_EQ(p.calls(Op::kAttnProj), 0u);
  EXPECT_EQ(p.tokens(), 0);
}

TEST(OpProfile, InactiveOrNullProfilesCountNothing) {
  OpProfile p;
  { const OpTimer t(&p, Op::kNorm, 10); }
  { const OpTimer t(nullptr, Op::kNorm, 10); }
  EXPECT_EQ(p.calls(Op::kNorm), 0u);
  p.set_active(true);
  { const OpTimer t(&p, Op::kNorm, 10); }
  EXPECT_EQ(p.calls(Op::kNorm), 1u);
  EXPECT_EQ(p.bytes(Op::kNorm), 10u);
}

class OpProfileForward : public ::testing::TestWithParam<std::string> {};

TEST_P(OpProfileForward, EveryOpOncePerLayerOfItsKind) {
  const std::string arch = GetParam();
  const auto dir =
      arch == "qwen3moe" ? moe::test::testdata_dir() : moe::test::qwen35moe_testdata_dir();
  const auto file =
      gguf::GgufFile::open((dir / "models" / ("tiny-" + arch + "-sv-Q8_0.gguf")).string());
  cpu::ThreadPool pool(2);
  auto model = create_model_arch(file, pool, nullptr);
  const ModelConfig& cfg = model->config();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.n_vocab - 1));
  std::vector<int32_t> prompt(5);
  for (auto& t : prompt) t = tok(rng);
  std::vector<float> plain(static_cast<size_t>(cfg.n_vocab)), timed(plain.size());
  {
    KvCache cache = model->make_cache(16, KvConfig{});
    model->forward(prompt, cache, LogitsMode::Last, plain.data());
  }

  OpProfile p;
  ASSERT_TRUE(model->set_op_profile(&p));
  KvCache cache = model->make_cache(16, KvConfig{});
  model->forward(prompt, cache, LogitsMode::Last, timed.data());  // inactive: nothing counted
  EXPECT_EQ(p.tokens(), 0);
  EXPECT_EQ(p.calls(Op::kEmbed), 0u);
  EXPECT_EQ(timed, plain) << "profiling must not change the forward";

  p.set_active(true);
  const int32_t next = tok(rng);
  model->forward(std::span<const int32_t>(&next, 1), cache, LogitsMode::Last, timed.data());
  EXPECT_EQ(p.tokens(), 1);
  EXPECT_EQ(p.calls(Op::kEmbed), 1u);
  EXPECT_EQ(p.calls(Op::kOutput), 1u);
  EXPECT_GT(p.bytes(Op::kOutput), 0u);
  const auto L = static_cast<uint64_t>(cfg.n_layer);
  uint64_t recurrent = 0;
  for (int64_t l = 0; l < cfg.n_layer; ++l) recurrent += cfg.is_recurrent(l) ? 1 : 0;
  const uint64_t attention = L - recurrent;
  EXPECT_EQ(p.calls(Op::kRoutedExperts), L);
  EXPECT_EQ(p.calls(Op::kAttnProj), attention);
  EXPECT_EQ(p.calls(Op::kAttention), attention);
  EXPECT_EQ(p.calls(Op::kAttnOut), attention);
  EXPECT_GT(p.bytes(Op::kAttnProj), 0u);
  EXPECT_EQ(p.calls(Op::kSsmProj), recurrent);
  EXPECT_EQ(p.calls(Op::kSsmDelta), recurrent);
  EXPECT_EQ(p.calls(Op::kSsmOut), recurrent);
  EXPECT_EQ(p.calls(Op::kSharedExpert), arch == "qwen35moe" ? L : 0u);
  if (arch == "qwen35moe") {
    EXPECT_GT(recurrent, 0u);
    EXPECT_GT(attention, 0u);
  }
  model->set_op_profile(nullptr);
}

INSTANTIATE_TEST_SUITE_P(Archs, OpProfileForward, ::testing::Values("qwen3moe", "qwen35moe"));

}  // namespace
}  // namespace moe::model
