// moe-bench --expert-prediction's measurement on the tiny models of the three architectures: one
// row per layer after the first, shares in [0, 1] with the top 2k finding at least what the top k
// finds, the after-attention columns exactly where the architecture keeps that residual, and the
// router of layer l+1 on layer l's state naming its experts far more often than chance (a wrong
// router, norm or bias tensor would drop it to about k / n_expert).
#include "coordinator/tools/expert_prediction.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/gguf.h"
#include "coordinator/model/model_arch.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/testdata.h"

namespace {

void check(const std::string& path, bool has_attn) {
  SCOPED_TRACE(path);
  const auto file = moe::gguf::GgufFile::open(path);
  moe::cpu::ThreadPool pool(2);
  auto model = moe::model::create_model_arch(file, pool);
  const auto& cfg = model->config();
  std::vector<int32_t> ids;
  for (int i = 0; i < 48; ++i) ids.push_back((i * 7919 + 13) % 1000);
  const auto rows = moe::tools::measure_expert_prediction(*model, file, ids);
  ASSERT_EQ(static_cast<int64_t>(rows.size()), cfg.n_layer - 1);
  double mean = 0;
  for (const auto& r : rows) {
    EXPECT_GE(r.hit_out, 0.0);
    EXPECT_LE(r.recall2_out, 1.0);
    EXPECT_LE(r.hit_out, r.recall2_out);
    EXPECT_EQ(r.hit_attn >= 0, has_attn);
    if (has_attn) {
      EXPECT_LE(r.hit_attn, r.recall2_attn);
    }
    mean += r.hit_out / static_cast<double>(rows.size());
  }
  const double chance = static_cast<double>(cfg.n_expert_used) / static_cast<double>(cfg.n_expert);
  EXPECT_GT(mean, 2 * chance);
  const std::string table = moe::tools::prediction_table(rows, cfg.n_expert_used, cfg.n_expert);
  EXPECT_NE(table.find("| chance |"), std::string::npos);
}

TEST(ExpertPrediction, TinyModelsOfEveryArchitecture) {
  check((moe::test::testdata_dir() / "models/tiny-qwen3moe-sv-F16.gguf").string(), false);
  check((moe::test::qwen35moe_testdata_dir() / "models/tiny-qwen35moe-sv-F16.gguf").string(), true);
  check((moe::test::gptoss_testdata_dir() / "models/tiny-gptoss-MXFP4.gguf").string(), false);
}

}  // namespace
