// The synthetic-model generator's promises beyond shapes (reference_test covers those): the
// Q4_K_M type rules of llama-quantize, the real model's preset, an expert-popularity skew that
// really concentrates routing, and a tokenizer copied from another GGUF.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "tests/model/synth_model.h"
#include "tests/testdata.h"
#include "tools/synth/qwen3moe_synth.h"

namespace {

namespace fs = std::filesystem;
using moe::GgmlType;
using moe::synth::Qwen3MoeSpec;

std::string temp_path(const std::string& tag) {
  return (fs::temp_directory_path() /
          ("moe_synth_" + tag + "_" + std::to_string(::getpid()) + ".gguf"))
      .string();
}

// formats.md §3.1's worked example: in a 48-layer Q4_K_M qwen3moe, layers 0-5, 8, 11, ..., 41
// and 42-47 (24 layers) have Q6_K attn_v and ffn_down_exps; everything else stays Q4_K except
// output (Q6_K); router and norms are F32.
TEST(SynthQuantMix, Q4KMMatchesLlamaQuantizeRules) {
  Qwen3MoeSpec s = moe::synth::preset("qwen3-30b-a3b");
  s.wtype = GgmlType::Q4_K;
  s.mix = Qwen3MoeSpec::Mix::KQuantM;
  std::vector<int> more_bits;
  for (int l = 0; l < 48; ++l) {
    const GgmlType v =
        moe::synth::tensor_type_for(s, "blk." + std::to_string(l) + ".attn_v.weight", l, 2048);
    const GgmlType d = moe::synth::tensor_type_for(
        s, "blk." + std::to_string(l) + ".ffn_down_exps.weight", l, 768);
    EXPECT_EQ(v, d) << l;
    if (v == GgmlType::Q6_K) more_bits.push_back(l);
    EXPECT_EQ(
        moe::synth::tensor_type_for(s, "blk." + std::to_string(l) + ".attn_q.weight", l, 2048),
        GgmlType::Q4_K);
  }
  std::vector<int> expected = {0, 1, 2, 3, 4, 5};
  for (int l = 8; l <= 41; l += 3) expected.push_back(l);
  for (int l = 42; l < 48; ++l) expected.push_back(l);
  EXPECT_EQ(more_bits, expected);
  EXPECT_EQ(expected.size(), 24u);
  EXPECT_EQ(moe::synth::tensor_type_for(s, "output.weight", -1, 2048), GgmlType::Q6_K);
  EXPECT_EQ(moe::synth::tensor_type_for(s, "token_embd.weight", -1, 2048), GgmlType::Q4_K);
  EXPECT_EQ(moe::synth::file_type_of(GgmlType::Q4_K, Qwen3MoeSpec::Mix::KQuantM), 15u);
  // Rows not divisible by 256 fall back as llama-quantize does.
  EXPECT_EQ(moe::synth::tensor_type_for(s, "blk.0.attn_q.weight", 0, 96), GgmlType::Q5_0);
  EXPECT_EQ(moe::synth::tensor_type_for(s, "output.weight", -1, 96), GgmlType::Q8_0);
  s.tied = true;  // a tied head puts the output rule on token_embd
  EXPECT_EQ(moe::synth::tensor_type_for(s, "token_embd.weight", -1, 2048), GgmlType::Q6_K);
}

TEST(SynthPreset, Qwen3_30B_A3BShapes) {
  const Qwen3MoeSpec s = moe::synth::preset("qwen3-30b-a3b");
  EXPECT_EQ(s.n_layer, 48);
  EXPECT_EQ(s.n_embd, 2048);
  EXPECT_EQ(s.n_head, 32);
  EXPECT_EQ(s.n_head_kv, 4);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.n_expert, 128);
  EXPECT_EQ(s.n_expert_used, 8);
  EXPECT_EQ(s.n_ff, 768);
  EXPECT_EQ(s.n_vocab, 151936);
  EXPECT_THROW(moe::synth::preset("qwen9"), moe::Error);
}

// A written K-quant model has the mixed types in its file and loads.
TEST(SynthQuantMix, WrittenFileHasTheMix) {
  moe::test::SynthSpec s;
  s.n_layer = 2;
  s.n_embd = 256;
  s.n_ff = 256;
  s.wtype = GgmlType::Q4_K;
  s.mix = Qwen3MoeSpec::Mix::KQuantM;
  const std::string path = temp_path("mix");
  moe::synth::write_qwen3moe(path, s);
  const auto file = moe::gguf::GgufFile::open(path);
  std::map<std::string, uint32_t> type;
  for (const auto& t : file.tensors()) type[std::string(t.name)] = t.type_id;
  EXPECT_EQ(type["blk.0.attn_v.weight"], static_cast<uint32_t>(GgmlType::Q4_K));
  EXPECT_EQ(type["blk.1.attn_v.weight"], static_cast<uint32_t>(GgmlType::Q6_K));  // 7n/8 = 1
  EXPECT_EQ(type["blk.1.ffn_down_exps.weight"], static_cast<uint32_t>(GgmlType::Q6_K));
  EXPECT_EQ(type["blk.0.ffn_gate_exps.weight"], static_cast<uint32_t>(GgmlType::Q4_K));
  EXPECT_EQ(type["output.weight"], static_cast<uint32_t>(GgmlType::Q6_K));
  EXPECT_EQ(type["blk.0.ffn_gate_inp.weight"], static_cast<uint32_t>(GgmlType::F32));
  EXPECT_EQ(file.require_uint("general.file_type"), 15u);
  fs::remove(path);
}

// Share of all expert selections that go to each layer's `top` most chosen experts.
double top_share(const std::string& path, int top) {
  const auto file = moe::gguf::GgufFile::open(path);
  moe::cpu::ThreadPool pool(1);
  auto model = moe::model::create_model_arch(file, pool);
  const auto& cfg = model->config();
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(cfg.n_layer),
                                           std::vector<int64_t>(static_cast<size_t>(cfg.n_expert)));
  moe::model::ForwardHooks hooks;
  hooks.observe_layer = [&](const moe::model::LayerTrace& t) {
    for (int64_t i = 0; i < t.n_tokens * t.n_expert_used; ++i) {
      ++counts[static_cast<size_t>(t.layer)][static_cast<size_t>(t.experts[i])];
    }
  };
  std::vector<int32_t> tokens;
  for (int i = 0; i < 96; ++i) tokens.push_back(static_cast<int32_t>((i * 53 + 7) % cfg.n_vocab));
  auto cache = model->make_cache(128, moe::model::KvType::F32, moe::model::KvType::F32);
  std::vector<float> logits(static_cast<size_t>(cfg.n_vocab));
  model->forward(tokens, cache, moe::model::LogitsMode::Last, logits.data(), &hooks);
  double share = 0;
  for (auto& c : counts) {
    std::sort(c.begin(), c.end(), std::greater<>());
    const double total = static_cast<double>(std::accumulate(c.begin(), c.end(), int64_t{0}));
    share += static_cast<double>(std::accumulate(c.begin(), c.begin() + top, int64_t{0})) / total;
  }
  return share / static_cast<double>(counts.size());
}

TEST(SynthSkew, ConcentratesRouting) {
  moe::test::SynthSpec s;
  s.n_layer = 3;
  s.n_expert = 16;
  s.n_expert_used = 2;
  const std::string flat = temp_path("flat"), skewed = temp_path("skewed");
  moe::synth::write_qwen3moe(flat, s);
  s.skew = 1.5f;
  moe::synth::write_qwen3moe(skewed, s);
  const double share_flat = top_share(flat, 4), share_skewed = top_share(skewed, 4);
  std::printf("[synth] top-4 of 16 experts take %.0f%% of selections flat, %.0f%% at skew 1.5\n",
              100 * share_flat, 100 * share_skewed);
  // Without skew the top 4 of 16 get 25% plus what random weights and 192 samples add (40%
  // measured); a logit bias of -1.5*ln(1+rank) puts most of the traffic there.
  EXPECT_LT(share_flat, 0.55);
  EXPECT_GT(share_skewed, 0.8);
  fs::remove(flat);
  fs::remove(skewed);
  s.skew = -1.0f;
  EXPECT_THROW(moe::synth::write_qwen3moe(skewed, s), moe::Error);
}

// --vocab-from: the real Qwen3 vocabulary (and template) in a random-weight model.
TEST(SynthVocabFrom, CopiesTokenizer) {
  const std::string src = (moe::test::testdata_dir() / "models/qwen3-vocab-only.gguf").string();
  moe::test::SynthSpec s;
  s.n_layer = 1;
  s.vocab_from = src;
  const std::string path = temp_path("vocab");
  moe::synth::write_qwen3moe(path, s);
  const auto a = moe::gguf::GgufFile::open(src), b = moe::gguf::GgufFile::open(path);
  const auto& ta = a.require_array("tokenizer.ggml.tokens");
  const auto& tb = b.require_array("tokenizer.ggml.tokens");
  ASSERT_EQ(ta.count, tb.count);
  EXPECT_EQ(ta.strings, tb.strings);
  EXPECT_EQ(b.find_tensor("token_embd.weight")->ne[1], static_cast<int64_t>(ta.count));
  EXPECT_EQ(a.get_string("tokenizer.chat_template", "a"),
            b.get_string("tokenizer.chat_template", "b"));
  const auto tok_a = moe::tokenizer::Tokenizer::from_gguf(a);
  const auto tok_b = moe::tokenizer::Tokenizer::from_gguf(b);
  const std::string text = "Hello wörld <|im_start|>user 12345";
  EXPECT_EQ(tok_a.encode(text, true), tok_b.encode(text, true));
  fs::remove(path);
}

}  // namespace
