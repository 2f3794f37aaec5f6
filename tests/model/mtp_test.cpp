// The multi-token-prediction block of qwen35moe (moe-synth --mtp, shaped as the real files carry
// it) on the CPU: it loads only when the file has it; its drafts follow the target's state — the
// drafter's first draft after a prompt is the block's most likely token for (the chosen token,
// the target's state after the prompt's last token), caught up on the prompt with each token
// paired with the state one position before, logits bit for bit; a batch through the block
// gives its row-by-row results; and greedy decoding with its drafts verified in batches chooses
// exactly the tokens generate() chooses without them (the guarantee: a wrong draft costs a
// verification only).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/model/draft_policy.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/model/mtp_draft.h"
#include "coordinator/model/speculative.h"
#include "kernels/cpu/thread_pool.h"
#include "tools/synth/qwen35moe_synth.h"

namespace {

using namespace moe::model;
namespace fs = std::filesystem;

std::string synth(bool mtp) {
  const std::string path = (fs::temp_directory_path() / ("moe_mtp_" + std::to_string(mtp) + "_" +
                                                         std::to_string(::getpid()) + ".gguf"))
                               .string();
  moe::synth::Qwen35MoeSpec s = moe::synth::qwen35moe_preset("tiny-qwen35moe");
  s.mtp = mtp;
  s.threads = 2;
  moe::synth::write_qwen35moe(path, s);
  return path;
}

struct Loaded {
  explicit Loaded(bool mtp)
      : path(synth(mtp)),
        file(moe::gguf::GgufFile::open(path)),
        model(create_model_arch(file, pool)) {}
  ~Loaded() { fs::remove(path); }
  std::string path;
  moe::gguf::GgufFile file;
  moe::cpu::ThreadPool pool{2};
  std::unique_ptr<ModelArch> model;
};

std::vector<int32_t> prompt() {
  std::vector<int32_t> p;
  for (int i = 0; i < 19; ++i) p.push_back((i * 37 + 11) % 1500);
  return p;
}

// The block's logits for the last of `history` by hand: token q paired with hidden row q - 1 (the
// target's state; zeros for the first), the first `batch` tokens as one batch, the rest one by
// one, the last with the state after the one before it.
std::vector<float> hand_draft_logits(ModelArch& m, const std::vector<int32_t>& history,
                                     const std::vector<float>& hidden, int64_t batch) {
  const int64_t E = m.config().n_embd, n = static_cast<int64_t>(history.size()) - 1;
  std::vector<float> h_in(static_cast<size_t>((n + 1) * E), 0.0f), h_out(h_in.size());
  std::copy(hidden.begin(), hidden.begin() + n * E, h_in.begin() + E);
  KvCache mc = m.make_mtp_cache(n + 1);
  m.mtp_forward({history.data(), static_cast<size_t>(batch)}, h_in.data(), mc, h_out.data(),
                nullptr);
  std::vector<float> logits(static_cast<size_t>(m.config().n_vocab));
  for (int64_t q = batch; q <= n; ++q) {
    m.mtp_forward({&history[static_cast<size_t>(q)], 1}, h_in.data() + q * E, mc,
                  h_out.data() + q * E, q == n ? logits.data() : nullptr);
  }
  return logits;
}

TEST(Mtp, LoadsOnlyWhenTheFileHasTheBlock) {
  Loaded with(true), without(false);
  EXPECT_TRUE(with.model->has_mtp());
  EXPECT_EQ(with.model->config().n_layer, 4);  // block_count 5, nextn_predict_layers 1
  EXPECT_FALSE(without.model->has_mtp());
  EXPECT_THROW(without.model->make_mtp_cache(16), moe::Error);
  EXPECT_THROW(mtp_drafter(*without.model, 16, 2), moe::Error);
}

TEST(Mtp, FirstDraftPairsEachTokenWithTheStateBefore) {
  Loaded x(true);
  ModelArch& m = *x.model;
  const int64_t E = m.config().n_embd, V = m.config().n_vocab;
  const std::vector<int32_t> p = prompt();
  const auto n = static_cast<int64_t>(p.size());

  // The target's hidden rows of the prompt, and its choice after it.
  std::vector<float> hidden, row(static_cast<size_t>(V));
  ForwardHooks hooks;
  hooks.observe_hidden = [&](std::span<const int32_t>, int64_t, const float* h) {
    hidden.assign(h, h + n * E);
  };
  KvCache c = m.make_cache(64, KvType::F32, KvType::F32);
  m.forward(p, c, LogitsMode::Last, row.data(), &hooks);
  ASSERT_EQ(hidden.size(), static_cast<size_t>(n * E));
  const int32_t chosen = argmax(row);

  // By hand: the block over the prompt, then the chosen token.
  std::vector<int32_t> history = p;
  history.push_back(chosen);
  const std::vector<float> mtp_logits = hand_draft_logits(m, history, hidden, n);
  const int32_t want = argmax(mtp_logits);

  // The drafter, fed by the target's forward: the same logits, bit for bit.
  std::vector<float> drafted_logits;
  Drafter d = mtp_drafter(m, 64, 1, &drafted_logits);
  KvCache c2 = m.make_cache(64, KvType::F32, KvType::F32);
  ForwardHooks h2;
  h2.observe_hidden = d.observe;
  m.forward(p, c2, LogitsMode::Last, row.data(), &h2);
  EXPECT_EQ(d.draft(history), std::vector<int32_t>{want});
  EXPECT_EQ(drafted_logits, mtp_logits);
}

TEST(Mtp, ABatchGivesTheRowByRowResults) {
  Loaded x(true);
  ModelArch& m = *x.model;
  const int64_t E = m.config().n_embd;
  const std::vector<int32_t> t{5, 77, 901, 13};
  std::vector<float> h(static_cast<size_t>(4 * E));
  for (size_t i = 0; i < h.size(); ++i) h[i] = std::sin(0.37f * static_cast<float>(i));
  KvCache a = m.make_mtp_cache(16), b = m.make_mtp_cache(16);
  std::vector<float> ha(h.size()), hb(h.size());
  m.mtp_forward(t, h.data(), a, ha.data(), nullptr);
  for (int64_t i = 0; i < 4; ++i) {
    m.mtp_forward({&t[static_cast<size_t>(i)], 1}, h.data() + i * E, b, hb.data() + i * E, nullptr);
  }
  EXPECT_EQ(a.n_past(), 4);
  double d = 0;
  for (size_t i = 0; i < ha.size(); ++i) d = std::max(d, std::fabs(double(ha[i]) - hb[i]));
  EXPECT_EQ(d, 0.0);  // the CPU kernels sum a row alike in any batch
}

TEST(Mtp, GreedyTokensEqualThoseWithoutDrafts) {
  Loaded x(true);
  ModelArch& m = *x.model;
  const std::vector<int32_t> p = prompt();
  GenerateOptions opt;
  opt.n_steps = 24;
  KvCache plain = m.make_cache(128, KvType::F32, KvType::F32);
  const GenerateResult want = generate(m, plain, p, opt);
  for (const int draft_max : {1, 3}) {
    SCOPED_TRACE(draft_max);
    KvCache c = m.make_cache(128, KvType::F32, KvType::F32);
    SpeculativeStats st;
    const GenerateResult got =
        generate_speculative(m, c, p, opt, mtp_drafter(m, 128, draft_max), &st);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(c.n_past(), plain.n_past());
    EXPECT_GT(st.drafted, 0);
    std::printf("[mtp] draft max %d: %s\n", draft_max, describe(st).c_str());
    // Priced: the cost model asked before drafting (one draft kept for its acceptance when off).
    KvCache cp = m.make_cache(128, KvType::F32, KvType::F32);
    DraftPolicy policy(draft_max);
    SpeculativeStats sp;
    const GenerateResult priced =
        generate_speculative(m, cp, p, opt, mtp_drafter(m, 128, draft_max), &sp, &policy);
    EXPECT_EQ(priced.tokens, want.tokens);
    EXPECT_EQ(cp.n_past(), plain.n_past());
    std::printf("[mtp] draft max %d, priced: %s, acceptance %.2f\n", draft_max,
                describe(sp).c_str(), policy.acceptance());
  }
}

// Oracle drafts (the greedy answer, every third one spoiled) are verified, accepted in part and
// rolled back, while the block follows the target through observe and rewind: afterwards its
// draft's logits are exactly those of a block caught up by hand on the hidden rows the target
// finally kept for each position (the prompt as one batch, then row by row, as the follower's
// small verification batches compute them).
TEST(Mtp, FollowsTheTargetThroughAcceptedAndRejectedDrafts) {
  Loaded x(true);
  ModelArch& m = *x.model;
  const int64_t E = m.config().n_embd;
  const std::vector<int32_t> p = prompt();
  GenerateOptions opt;
  opt.n_steps = 16;
  KvCache plain = m.make_cache(128, KvType::F32, KvType::F32);
  const GenerateResult want = generate(m, plain, p, opt);

  std::vector<float> followed_logits;
  Drafter mtp = mtp_drafter(m, 128, 1, &followed_logits);
  std::vector<float> kept(static_cast<size_t>(128 * E));  // the target's last row per position
  Drafter oracle;
  oracle.observe = [&](std::span<const int32_t> t, int64_t pos0, const float* h) {
    std::copy(h, h + static_cast<int64_t>(t.size()) * E, kept.begin() + pos0 * E);
    mtp.observe(t, pos0, h);
  };
  oracle.rewind = mtp.rewind;
  oracle.draft = [&](std::span<const int32_t> history) {
    std::vector<int32_t> d;
    for (size_t i = history.size() - p.size(); i < want.tokens.size() && d.size() < 3; ++i) {
      d.push_back(i % 3 == 2 ? (want.tokens[i] + 1) % 1000 : want.tokens[i]);
    }
    return d;
  };
  KvCache c = m.make_cache(128, KvType::F32, KvType::F32);
  SpeculativeStats st;
  const GenerateResult got = generate_speculative(m, c, p, opt, oracle, &st);
  ASSERT_EQ(got.tokens, want.tokens);
  EXPECT_GT(st.accepted, 0);
  EXPECT_LT(st.accepted, st.drafted);

  std::vector<int32_t> history = p;
  history.insert(history.end(), got.tokens.begin(), got.tokens.end());
  const std::vector<int32_t> followed = mtp.draft(history);
  ASSERT_EQ(followed.size(), 1u);

  ASSERT_EQ(static_cast<int64_t>(history.size()) - 1, c.n_past());
  const std::vector<float> logits =
      hand_draft_logits(m, history, kept, static_cast<int64_t>(p.size()));
  EXPECT_EQ(followed[0], argmax(logits));
  EXPECT_EQ(followed_logits, logits);
}

}  // namespace
