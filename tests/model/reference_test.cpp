// The optimized forward (prefill batch + KV-cache decode) against the scalar double-precision
// ReferenceForward on moe-synth models of several shapes and weight types. The experts are forced
// to the reference's own choice so that activation quantization cannot flip a near-tie routing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "coordinator/model/attention.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "tests/model/reference_forward.h"
#include "tests/model/synth_model.h"

namespace {

namespace fs = std::filesystem;
using namespace moe::model;
using moe::GgmlType;

struct Case {
  std::string name;
  moe::test::SynthSpec spec;
  double tol_max_rel, tol_rms_rel;  // relative to the RMS of the reference logits
  int threads = 1;
};

moe::test::SynthSpec shape(int layers, int embd, int head, int head_kv, int hd, int n_exp, int used,
                           int ff, int vocab, bool tied, GgmlType t) {
  moe::test::SynthSpec s;
  s.n_layer = layers;
  s.n_embd = embd;
  s.n_head = head;
  s.n_head_kv = head_kv;
  s.head_dim = hd;
  s.n_expert = n_exp;
  s.n_expert_used = used;
  s.n_ff = ff;
  s.n_vocab = vocab;
  s.tied = tied;
  s.wtype = t;
  return s;
}

// Tolerances per weight type: F32 weights take f32 activations (only summation order differs);
// F16 rounds activations to 11 bits; BF16 to 8 bits; Q8_0 quantizes them to 8-bit blocks.
// Measured (max|diff|/rms, rms diff/rms): f32 1.5e-6/3e-7, f16 2.4e-3/5.8e-4,
// bf16 2.2e-2/4.9e-3, q8_0 8.9e-2/1.9e-2 (errors compound over layers).
double tol_max(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return 1e-4;
    case GgmlType::F16:
      return 1e-2;
    case GgmlType::BF16:
      return 5e-2;
    default:
      return 0.15;
  }
}
double tol_rms(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return 2e-5;
    case GgmlType::F16:
      return 2e-3;
    case GgmlType::BF16:
      return 1e-2;
    default:
      return 3e-2;
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const GgmlType types[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0};
  const char* tn[] = {"f32", "f16", "bf16", "q8_0"};
  for (int i = 0; i < 4; ++i) {
    const GgmlType t = types[i];
    const int th = t == GgmlType::F32 ? 2 : 1;
    out.push_back({std::string("gqa2_") + tn[i], shape(2, 64, 4, 2, 32, 6, 2, 64, 96, false, t),
                   tol_max(t), tol_rms(t), th});
    out.push_back({std::string("gqa3_l3_") + tn[i], shape(3, 96, 6, 2, 32, 5, 3, 64, 160, false, t),
                   tol_max(t), tol_rms(t), th});
    out.push_back({std::string("mqa_hd64_tied_") + tn[i],
                   shape(1, 128, 4, 1, 64, 9, 4, 96, 128, true, t), tol_max(t), tol_rms(t), th});
    out.push_back({std::string("mha_allexp_l4_") + tn[i],
                   shape(4, 64, 2, 2, 64, 4, 4, 32, 64, false, t), tol_max(t), tol_rms(t), th});
  }
  // K-quant weights (Q4_K_M rules: Q4_K, Q6_K on the last layer's attn_v/ffn_down and the
  // output) take Q8_K activations; and a skewed router with its large embedding dimension.
  moe::test::SynthSpec k = shape(2, 256, 4, 2, 64, 6, 2, 256, 96, false, GgmlType::Q4_K);
  k.mix = moe::synth::Qwen3MoeSpec::Mix::KQuantM;
  out.push_back({"q4_k_m_256", k, tol_max(GgmlType::Q4_K), tol_rms(GgmlType::Q4_K), 2});
  moe::test::SynthSpec sk = shape(2, 64, 4, 2, 32, 8, 2, 64, 96, false, GgmlType::F16);
  sk.skew = 1.0f;
  out.push_back({"skew_f16", sk, tol_max(GgmlType::F16), tol_rms(GgmlType::F16), 1});
  return out;
}

void compare(const Case& c, const std::string& path) {
  const auto file = moe::gguf::GgufFile::open(path);
  const ReferenceForward ref(file);
  // The f32 cases run threaded (exact comparison, so any threading bug shows); the rest on one
  // thread to stay fast on a loaded machine.
  moe::cpu::ThreadPool pool(c.threads);
  auto model = create_model_arch(file, pool);
  const int64_t V = model->config().n_vocab, K = model->config().n_expert_used;

  // A 40-token prefill takes the block path of model::attention (kBlockPathTokens), the decode
  // steps after it the per-head path.
  static_assert(kBlockPathTokens <= 40);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 46; ++i) tokens.push_back(static_cast<int32_t>((i * 37 + 11) % V));
  const ReferenceForward::Result r = ref.run(tokens);

  // Replay the reference's expert choice.
  ForwardHooks hooks;
  hooks.force_experts = [&](int64_t l, int64_t pos, int32_t* e) {
    std::copy_n(r.experts[static_cast<size_t>(l)].begin() + pos * K, K, e);
    return true;
  };
  const int64_t n_prefill = 40;
  KvCache cache = model->make_cache(64, KvType::F32, KvType::F32);
  std::vector<float> logits = evaluate_batch(
      *model, cache, std::span<const int32_t>(tokens.data(), static_cast<size_t>(n_prefill)),
      &hooks);
  std::vector<float> row(static_cast<size_t>(V));
  for (size_t t = static_cast<size_t>(n_prefill); t < tokens.size(); ++t) {
    model->forward(std::span<const int32_t>(&tokens[t], 1), cache, LogitsMode::Last, row.data(),
                   &hooks);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  ASSERT_EQ(logits.size(), r.logits.size());
  double ref_ss = 0, max_d = 0, ss = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double d = logits[i] - r.logits[i];
    ref_ss += r.logits[i] * r.logits[i];
    ss += d * d;
    max_d = std::max(max_d, std::fabs(d));
  }
  const double ref_rms = std::sqrt(ref_ss / static_cast<double>(logits.size()));
  const double rms = std::sqrt(ss / static_cast<double>(logits.size()));
  std::printf("[reference] %-22s logit rms %.3f  max|diff|/rms %.2e  rms diff/rms %.2e\n",
              c.name.c_str(), ref_rms, max_d / ref_rms, rms / ref_rms);
  EXPECT_GT(ref_rms, 0.05);  // the comparison means something
  EXPECT_LE(max_d / ref_rms, c.tol_max_rel);
  EXPECT_LE(rms / ref_rms, c.tol_rms_rel);
}

class ReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceTest, OptimizedMatchesReference) {
  const Case& c = GetParam();
  const std::string path = (fs::temp_directory_path() / ("moe_model_ref_" + c.name + "_" +
                                                         std::to_string(::getpid()) + ".gguf"))
                               .string();
  moe::test::write_synth(path, c.spec);
  compare(c, path);
  fs::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ReferenceTest, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// The moe-synth tool's shape overrides produce models the forward loads and computes correctly.
TEST(ReferenceSynthTool, ShapeOverrides) {
  const std::string path =
      (fs::temp_directory_path() / ("moe_model_synth_" + std::to_string(::getpid()) + ".gguf"))
          .string();
  const std::string cmd = std::string(MOE_BIN_DIR) +
                          "/moe-synth --quant q8_0 --layers 3 --n-embd 96 --n-head 6 --n-head-kv 2 "
                          "--head-dim 32 --n-expert 7 --n-expert-used 3 --n-ff-exp 64 --tied -o '" +
                          path + "' > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto file = moe::gguf::GgufFile::open(path);
  const ModelConfig cfg = ModelConfig::from_gguf(file);
  EXPECT_EQ(cfg.n_embd, 96);
  EXPECT_EQ(cfg.n_head[0], 6);
  EXPECT_EQ(cfg.n_head_kv[0], 2);
  EXPECT_EQ(cfg.n_expert, 7);
  EXPECT_EQ(cfg.n_expert_used, 3);
  EXPECT_EQ(file.find_tensor("output.weight"), nullptr);
  compare({"synth_tool_q8_0", {}, tol_max(GgmlType::Q8_0), tol_rms(GgmlType::Q8_0)}, path);
  fs::remove(path);
}

}  // namespace
