// n-gram drafting (ngram_draft) and greedy decoding with drafts verified in one batch
// (generate_speculative) on the tiny qwen3moe and qwen35moe models, on the CPU:
//  * the lookup: the latest match, the longest suffix first, bounded by draft_max and by the
//    history's end, nothing for no match or bad options;
//  * the chosen tokens equal generate()'s without drafts (the guarantee: a wrong draft costs a
//    verification, never a different token), with drafts accepted whole, cut short and rejected
//    (an oracle that knows the greedy answer and spoils some of it) and with the n-gram lookup,
//    for an attention-only model (rolled back by truncation) and a hybrid one (rolled back by
//    its checkpoint and replayed);
//  * the rollback itself: after it the cache holds as many positions as without drafts, and the
//    next token's logits from it match those from the plain path's cache;
//  * a sampled choice gives the same tokens with the same seed, and a caller stopping after an
//    accepted draft leaves the cache as without drafts.
// Exact: the CPU kernels sum a row the same way whatever the batch around it, so the verified
// rows equal the one-token rows bit for bit.
#include "coordinator/model/speculative.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/sampling/sampler.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/testdata.h"

namespace {

using namespace moe::model;
using Tokens = std::vector<int32_t>;

TEST(NgramDraft, TakesTheLatestLongestMatch) {
  const Tokens h{5, 1, 2, 3, 9, 8, 1, 2, 3, 7, 6, 4, 1, 2, 3};
  NgramDraftOptions o;
  o.n_max = 3;
  o.n_min = 1;
  o.draft_max = 2;
  EXPECT_EQ(ngram_draft(h, o), (Tokens{7, 6}));  // "1 2 3" last seen before "7 6"
  o.draft_max = 10;
  EXPECT_EQ(ngram_draft(h, o), (Tokens{7, 6, 4, 1, 2, 3}));  // to the history's end
  // Only "3" repeats a shorter key: n_max 1 matches it.
  const Tokens h2{4, 3, 8, 5, 3};
  o.n_max = 1;
  EXPECT_EQ(ngram_draft(h2, o), (Tokens{8, 5, 3}));
  o.n_min = 2;
  o.n_max = 3;
  EXPECT_TRUE(ngram_draft(h2, o).empty());  // "5 3" never occurred before
  EXPECT_TRUE(ngram_draft(Tokens{1, 2, 3}, o).empty());
  EXPECT_TRUE(ngram_draft(Tokens{}, o).empty());
  EXPECT_TRUE(ngram_draft(Tokens{7}, NgramDraftOptions{}).empty());
  o.draft_max = 0;
  EXPECT_TRUE(ngram_draft(h, o).empty());
  o.draft_max = 4;
  o.n_min = 0;
  EXPECT_TRUE(ngram_draft(h, o).empty());
}

std::string model_path(const std::string& arch, const std::string& quant) {
  const auto dir =
      arch == "qwen3moe" ? moe::test::testdata_dir() : moe::test::qwen35moe_testdata_dir();
  return (dir / "models" / ("tiny-" + arch + "-sv-" + quant + ".gguf")).string();
}

class SpeculativeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SpeculativeTest, GreedyTokensEqualThoseWithoutDrafts) {
  const auto file = moe::gguf::GgufFile::open(model_path(GetParam(), "Q4_K_M"));
  moe::cpu::ThreadPool pool(2);
  auto model = create_model_arch(file, pool);
  const int64_t V = model->config().n_vocab;
  Tokens prompt;
  for (int r = 0; r < 3; ++r) {
    for (int32_t t : {11, 305, 42, 7, 1999, 64}) prompt.push_back(t % static_cast<int32_t>(V));
  }
  GenerateOptions opt;
  opt.n_steps = 40;
  opt.keep_logits = true;
  KvCache plain_cache = model->make_cache(128, KvType::F16, KvType::F16);
  const GenerateResult plain = generate(*model, plain_cache, prompt, opt);

  // Drafts that know the greedy answer but get every `wrong_every`-th drafted token wrong, so
  // that batches are accepted whole, cut short at every offset, and rejected at once (the tiny
  // models' greedy text rarely repeats itself, so the n-gram lookup alone would seldom hit).
  const auto oracle = [&](int draft_max, int wrong_every) {
    auto counter = std::make_shared<int>(0);
    return Drafter([&, draft_max, wrong_every, counter](std::span<const int32_t> history) {
      Tokens d;
      const size_t at = history.size() - prompt.size();  // tokens chosen so far
      for (size_t i = at; i < plain.tokens.size() && d.size() < static_cast<size_t>(draft_max);
           ++i) {
        const bool wrong = ++*counter % wrong_every == 0;
        d.push_back(wrong ? (plain.tokens[i] + 1) % static_cast<int32_t>(V) : plain.tokens[i]);
      }
      return d;
    });
  };
  struct Case {
    std::string name;
    Drafter drafter;
  };
  NgramDraftOptions ng;
  ng.draft_max = 4;
  const std::vector<Case> cases{{"oracle 1/2", oracle(1, 2)},
                                {"oracle 3/4", oracle(3, 4)},
                                {"oracle 8/5", oracle(8, 5)},
                                {"oracle 4/1", oracle(4, 1)},
                                {"n-gram", ngram_drafter(ng)}};
  for (const Case& c : cases) {
    KvCache cache = model->make_cache(128, KvType::F16, KvType::F16);
    SpeculativeStats st;
    const GenerateResult spec = generate_speculative(*model, cache, prompt, opt, c.drafter, &st);
    std::printf("[speculative] %s %-10s: %s\n", GetParam().c_str(), c.name.c_str(),
                describe(st).c_str());
    EXPECT_EQ(spec.tokens, plain.tokens) << c.name;
    ASSERT_EQ(spec.logits.size(), plain.logits.size()) << c.name;
    // Bit for bit: a row's numbers do not depend on the batch around it (the CPU dot kernels).
    EXPECT_EQ(spec.logits, plain.logits) << c.name;
    if (c.name.starts_with("oracle") && c.name != "oracle 4/1") {
      EXPECT_GT(st.accepted, 0) << c.name;
      EXPECT_LT(st.verifications, opt.n_steps - 1) << c.name;  // fewer forwards than tokens
    }
    if (c.name == "oracle 4/1") {
      EXPECT_EQ(st.accepted, 0);
    }
    const bool rejected = st.accepted < st.drafted;
    EXPECT_EQ(st.replays > 0, rejected && GetParam() == "qwen35moe") << c.name;
    // The rollback: as many positions as the plain path, and the same next logits from them.
    ASSERT_EQ(cache.n_past(), plain_cache.n_past()) << c.name;
    const int32_t next = spec.tokens.back();
    std::vector<float> a(static_cast<size_t>(V)), b(static_cast<size_t>(V));
    KvCache plain_copy = model->make_cache(128, KvType::F16, KvType::F16);
    generate(*model, plain_copy, prompt, opt);
    model->forward(std::span<const int32_t>(&next, 1), plain_copy, LogitsMode::Last, a.data());
    model->forward(std::span<const int32_t>(&next, 1), cache, LogitsMode::Last, b.data());
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < V; ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(a[i])));
    }
    EXPECT_EQ(diff, 0.0) << c.name << " (scale " << scale << ")";
  }
  // The cost model choosing the lengths (DraftPolicy): the same tokens and cache; after the
  // first step is timed it tries a 1-token draft before anything is known of batches, and it
  // learns that the oracle's drafts (all right here) stand.
  DraftPolicy policy(8);
  KvCache priced = model->make_cache(128, KvType::F16, KvType::F16);
  SpeculativeStats pst;
  const GenerateResult p =
      generate_speculative(*model, priced, prompt, opt, oracle(8, 1000), &pst, &policy);
  EXPECT_EQ(p.tokens, plain.tokens);
  EXPECT_EQ(priced.n_past(), plain_cache.n_past());
  EXPECT_GE(pst.verifications, 1);
  EXPECT_EQ(pst.accepted, pst.drafted);
  EXPECT_GT(policy.acceptance(), 0.8);
  EXPECT_GT(policy.step_seconds(1), 0.0);
}

// A sampled choice is made once per token from the same row in the same order as without drafts,
// so a sampler with the same seed gives the same tokens; the penalties see the same history.
// Drafts from an oracle that knows the sampled answer (accepted, cut short, rejected) and from
// the n-gram lookup; a caller stopping after an accepted draft leaves the cache where generate()
// leaves it.
TEST_P(SpeculativeTest, SampledTokensEqualThoseWithoutDrafts) {
  const auto file = moe::gguf::GgufFile::open(model_path(GetParam(), "Q4_K_M"));
  moe::cpu::ThreadPool pool(2);
  auto model = create_model_arch(file, pool);
  const auto V = static_cast<int32_t>(model->config().n_vocab);
  moe::sampling::SamplingParams sp;
  sp.seed = 1234;
  sp.temp = 1.5f;  // a flat distribution: the draws matter
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  sp.repeat_penalty = 1.3f;  // depends on the tokens emitted so far
  const auto sampled = [&](moe::sampling::Sampler& s) {
    return [&s](std::span<const float> row) {
      const int32_t t = s.sample(row);
      s.accept(t);
      return t;
    };
  };
  Tokens prompt;
  for (int r = 0; r < 3; ++r) {
    for (int32_t t : {11, 305, 42, 7, 1999, 64}) prompt.push_back(t % V);
  }
  GenerateOptions opt;
  opt.n_steps = 40;
  opt.keep_logits = true;
  moe::sampling::Sampler plain_sampler(sp, V);
  opt.pick = sampled(plain_sampler);
  KvCache plain_cache = model->make_cache(128, KvType::F16, KvType::F16);
  const GenerateResult plain = generate(*model, plain_cache, prompt, opt);
  std::set<int32_t> distinct(plain.tokens.begin(), plain.tokens.end());
  ASSERT_GT(distinct.size(), 5u) << "the draws should vary";

  const auto oracle = [&](int draft_max, int wrong_every) {
    auto counter = std::make_shared<int>(0);
    return Drafter([&, draft_max, wrong_every, counter](std::span<const int32_t> history) {
      Tokens d;
      for (size_t i = history.size() - prompt.size();
           i < plain.tokens.size() && d.size() < static_cast<size_t>(draft_max); ++i) {
        const bool wrong = ++*counter % wrong_every == 0;
        d.push_back(wrong ? (plain.tokens[i] + 1) % V : plain.tokens[i]);
      }
      return d;
    });
  };
  NgramDraftOptions ng;
  ng.draft_max = 4;
  ng.n_min = 1;
  const std::vector<std::pair<std::string, Drafter>> cases{
      {"oracle 3/4", oracle(3, 4)}, {"oracle 6/3", oracle(6, 3)}, {"n-gram", ngram_drafter(ng)}};
  for (const auto& [name, drafter] : cases) {
    moe::sampling::Sampler s(sp, V);
    GenerateOptions o = opt;
    o.pick = sampled(s);
    KvCache cache = model->make_cache(128, KvType::F16, KvType::F16);
    SpeculativeStats st;
    const GenerateResult spec = generate_speculative(*model, cache, prompt, o, drafter, &st);
    EXPECT_EQ(spec.tokens, plain.tokens) << name;
    EXPECT_EQ(spec.logits, plain.logits) << name;
    EXPECT_EQ(cache.n_past(), plain_cache.n_past()) << name;
    if (name != "n-gram") {
      EXPECT_GT(st.accepted, 0) << name;
      EXPECT_LT(st.accepted, st.drafted) << name;
    }
  }

  // Stopping after an accepted draft: the 7th token comes from a verified batch (the oracle
  // drafts 3 at a time, all right), and generate() would not have evaluated it.
  const auto stop_after = [](int n) {
    auto seen = std::make_shared<int>(0);
    return [n, seen](int32_t) { return ++*seen < n; };
  };
  GenerateOptions o = opt;
  o.on_token = stop_after(7);
  moe::sampling::Sampler s1(sp, V);
  o.pick = sampled(s1);
  KvCache c1 = model->make_cache(128, KvType::F16, KvType::F16);
  const GenerateResult ref = generate(*model, c1, prompt, o);
  moe::sampling::Sampler s2(sp, V);
  o.pick = sampled(s2);
  o.on_token = stop_after(7);
  KvCache c2 = model->make_cache(128, KvType::F16, KvType::F16);
  SpeculativeStats st;
  const GenerateResult spec = generate_speculative(*model, c2, prompt, o, oracle(3, 1000), &st);
  ASSERT_EQ(ref.tokens.size(), 7u);
  EXPECT_EQ(spec.tokens, ref.tokens);
  EXPECT_EQ(c2.n_past(), c1.n_past());
  EXPECT_GT(st.accepted, 0);
}

INSTANTIATE_TEST_SUITE_P(Archs, SpeculativeTest, ::testing::Values("qwen3moe", "qwen35moe"));

}  // namespace
