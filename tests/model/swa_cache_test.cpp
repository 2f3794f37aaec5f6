// Sliding-window rings (gpt-oss's SWA layers keep only their last window + slack positions on
// the host, KvConfig): the ring's bookkeeping (rows wrap, how far truncate() goes back,
// checkpoints, slot images), and the tiny gpt-oss model giving the same logits on a ring as with
// every position kept (--swa-full): token by token exactly, in batches within the chunking
// bound, after a truncation, from a checkpoint and after a context shift.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/model/forced_routing.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "tests/testdata.h"

namespace {

using namespace moe::model;

std::string model_path() {
  return (moe::test::gptoss_testdata_dir() / "models" / "tiny-gptoss-MXFP4.gguf").string();
}

// The tiny model's window is 8 on layers 0 and 2; a slack of 4 gives rings of 12 rows.
KvConfig ring_config(KvType t = KvType::F32, int64_t slack = 4) {
  KvConfig c = KvConfig::uniform(t, t);
  c.swa_slack = slack;
  return c;
}
KvConfig full_config(KvType t = KvType::F32) {
  KvConfig c = KvConfig::uniform(t, t);
  c.swa_full = true;
  return c;
}

// A K/V row of layer l whose values name the position.
std::vector<float> row_of(int64_t elems, int64_t pos, float side) {
  std::vector<float> r(static_cast<size_t>(elems));
  for (int64_t i = 0; i < elems; ++i) r[static_cast<size_t>(i)] = side * (pos * 100.0f + i);
  return r;
}

TEST(SwaCache, RingBookkeeping) {
  const auto file = moe::gguf::GgufFile::open(model_path());
  const ModelConfig cfg = ModelConfig::from_gguf(file);
  ASSERT_EQ(cfg.n_swa, 8);
  KvCache c(cfg, 64, ring_config());
  KvCache full(cfg, 64, full_config());
  EXPECT_EQ(c.ring_rows(0), 12);
  EXPECT_EQ(c.ring_rows(1), 0);
  EXPECT_EQ(full.ring_rows(0), 0);
  EXPECT_EQ(c.max_step(0), 5);  // 12 rows hold the window (8) of the first of 5 stored tokens
  EXPECT_EQ(c.max_step(1), 64);
  EXPECT_TRUE(c.needs_checkpoints());
  EXPECT_FALSE(full.needs_checkpoints());
  EXPECT_LT(c.bytes(), full.bytes());
  EXPECT_NE(c.describe().find("2 sliding-window layers keep their last 12 positions"),
            std::string::npos)
      << c.describe();
  // A context no longer than the ring keeps every position.
  EXPECT_EQ(KvCache(cfg, 12, ring_config()).ring_rows(0), 0);

  const int64_t E = c.k_row_elems(0);
  for (int64_t p = 0; p < 30; ++p) {
    for (int64_t l = 0; l < cfg.n_layer; ++l) {
      c.store(l, p, row_of(E, p, 1).data(), row_of(E, p, -1).data());
    }
  }
  c.advance(30);
  // The last 12 positions read back in position order across the wrap (30 % 12 = 6).
  std::vector<float> got(static_cast<size_t>(12 * E));
  c.read_k(0, 18, 12, got.data());
  for (int64_t p = 18; p < 30; ++p) {
    const auto want = row_of(E, p, 1);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + (p - 18) * E)) << p;
  }
  c.read_v(0, 25, 3, got.data());
  EXPECT_EQ(got[static_cast<size_t>(2 * E + 1)], row_of(E, 27, -1)[1]);
  EXPECT_THROW(c.read_k(0, 17, 13, got.data()), moe::Error);
  EXPECT_EQ(c.k_f32(0), nullptr);  // no direct rows on a ring
  EXPECT_NE(c.k_f32(1), nullptr);

  // Back at most the slack; to 0 or nowhere always.
  EXPECT_TRUE(c.can_truncate_to(26));
  EXPECT_FALSE(c.can_truncate_to(25));
  EXPECT_TRUE(c.can_truncate_to(0));
  EXPECT_TRUE(c.can_truncate_to(30));
  EXPECT_THROW(c.truncate(20), moe::Error);

  // A checkpoint keeps the ring's rows: positions written after it are undone by restoring.
  c.save_checkpoint();
  for (int64_t p = 30; p < 42; ++p)
    c.store(0, p, row_of(E, 999, 1).data(), row_of(E, 999, 1).data());
  c.advance(12);
  c.restore_checkpoint();
  EXPECT_EQ(c.n_past(), 30);
  c.read_k(0, 18, 12, got.data());
  EXPECT_EQ(got[static_cast<size_t>(11 * E + 3)], row_of(E, 29, 1)[3]);

  // A slot image holds the ring's last rows in position order; it imports into a new cache.
  SequenceImage img;
  c.export_image(img);
  EXPECT_EQ(img.layers[0].k.size(), 12 * c.k_row_size(0));
  EXPECT_EQ(img.layers[1].k.size(), 30 * c.k_row_size(1));
  KvCache d(cfg, 64, ring_config());
  d.import_image(img);
  EXPECT_EQ(d.n_past(), 30);
  std::vector<float> again(got.size());
  d.read_k(0, 18, 12, again.data());
  EXPECT_EQ(again, got);
  // An image of every position does not fit a ring, and the error says so.
  SequenceImage whole;
  full.advance(30);
  full.export_image(whole);
  EXPECT_THROW(d.import_image(whole), moe::Error);
}

struct Loaded {
  moe::gguf::GgufFile file = moe::gguf::GgufFile::open(model_path());
  moe::cpu::ThreadPool pool{2};
  std::unique_ptr<ModelArch> model = create_model_arch(file, pool);
  int64_t V() const { return model->config().n_vocab; }
};

// Some token ids, from a fixed generator (the model is random anyway).
std::vector<int32_t> tokens(int64_t n, int32_t salt) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i)
    t.push_back(static_cast<int32_t>((i * 7919 + salt * 104729) % 2000));
  return t;
}

// Last-row logits after each token, fed one at a time.
std::vector<float> one_by_one(Loaded& x, KvCache& c, const std::vector<int32_t>& toks) {
  std::vector<float> out, row(static_cast<size_t>(x.V()));
  for (const int32_t t : toks) {
    x.model->forward({&t, 1}, c, LogitsMode::Last, row.data(), nullptr);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// How far truncate() may go back counts from the furthest position stored, not from n_past():
// after going back, the rows past the new end still overwrote older positions of the ring. A
// cache whose rows live in VRAM has the same rings (the GPU forward allocates them).
TEST(SwaCache, TruncationCountsFromTheFurthestRowStored) {
  const auto file = moe::gguf::GgufFile::open(model_path());
  const ModelConfig cfg = ModelConfig::from_gguf(file);
  KvCache c(cfg, 64, ring_config());  // rings of 12 rows, slack 4
  c.advance(30);
  c.truncate(26);
  EXPECT_FALSE(c.can_truncate_to(25));
  EXPECT_FALSE(c.can_truncate_to(22));  // 4 back from 26, but 8 from the rows of 29
  c.advance(2);                         // at 28; rows up to 29 were stored
  EXPECT_TRUE(c.can_truncate_to(26));
  EXPECT_FALSE(c.can_truncate_to(25));
  c.advance(6);  // at 34, past everything stored before
  EXPECT_TRUE(c.can_truncate_to(30));
  EXPECT_FALSE(c.can_truncate_to(29));
  c.save_checkpoint();
  c.advance(3);
  c.truncate(35);
  c.restore_checkpoint();  // the rings hold the rows of the checkpoint again
  EXPECT_EQ(c.n_past(), 34);
  EXPECT_TRUE(c.can_truncate_to(30));
  c.clear();
  c.advance(5);
  EXPECT_TRUE(c.can_truncate_to(1));

  KvCache vram(cfg, 64, ring_config(), KvStorage::None);
  EXPECT_EQ(vram.ring_rows(0), 12);
  EXPECT_EQ(vram.ring_rows(1), 0);
  EXPECT_EQ(vram.max_step(0), 5);
  EXPECT_EQ(vram.bytes(), c.bytes());
  EXPECT_TRUE(vram.needs_checkpoints());
  EXPECT_EQ(KvCache(cfg, 64, full_config(), KvStorage::None).ring_rows(0), 0);
}

TEST(SwaCache, GptOssOnARingMatchesEveryPositionKept) {
  Loaded x;
  const auto toks = tokens(40, 1);
  for (const KvType t : {KvType::F32, KvType::Q8_0}) {
    SCOPED_TRACE(std::string(kv_type_name(t)));
    KvCache ring = x.model->make_cache(128, ring_config(t));
    KvCache full = x.model->make_cache(128, full_config(t));
    ASSERT_GT(ring.ring_rows(0), 0);
    // Token by token the same rows are read in the same order: the same bits.
    EXPECT_EQ(one_by_one(x, ring, toks), one_by_one(x, full, toks));
    // One batch: the ring's layers store and attend 5 tokens at a time, so summation orders
    // differ; routing forced to the golden experts so that a near tie cannot turn a rounding
    // difference into another expert (the bound of gptoss_test's chunked runs).
    const std::filesystem::path dir =
        moe::test::gptoss_testdata_dir() / "golden" / "tiny-gptoss-MXFP4" / "chat";
    const ForcedRouting forced(dir.string(), x.model->config().n_layer,
                               x.model->config().n_expert_used);
    const ForwardHooks hooks = forced.hooks();
    const auto prompt = moe::test::read_raw<int32_t>(dir / "prompt_tokens.i32");
    KvCache rb = x.model->make_cache(256, ring_config(t));
    KvCache fb = x.model->make_cache(256, full_config(t));
    const std::vector<float> a = evaluate_batch(*x.model, rb, prompt, &hooks);
    const std::vector<float> b = evaluate_batch(*x.model, fb, prompt, &hooks);
    EXPECT_LE(max_diff(a, b), 0.15);
  }
}

TEST(SwaCache, TruncationCheckpointAndShiftOnARing) {
  Loaded x;
  const auto head = tokens(30, 2), went = tokens(10, 3), goes = tokens(12, 4);
  // Cold: head then goes, every position kept.
  KvCache cold = x.model->make_cache(128, full_config());
  one_by_one(x, cold, head);
  const std::vector<float> want = one_by_one(x, cold, goes);

  // Back by 3 (within the slack of 4) after a detour of 3 tokens.
  KvCache r = x.model->make_cache(128, ring_config());
  one_by_one(x, r, head);
  one_by_one(x, r, std::vector<int32_t>(went.begin(), went.begin() + 3));
  ASSERT_TRUE(r.can_truncate_to(30));
  r.truncate(30);
  EXPECT_EQ(one_by_one(x, r, goes), want);

  // Back by 10 needs the checkpoint taken at 30.
  KvCache c = x.model->make_cache(128, ring_config());
  one_by_one(x, c, head);
  x.model->save_checkpoint(c);
  one_by_one(x, c, went);
  EXPECT_FALSE(c.can_truncate_to(30));
  ASSERT_TRUE(x.model->restore_checkpoint(c));
  EXPECT_EQ(c.n_past(), 30);
  EXPECT_EQ(one_by_one(x, c, goes), want);

  // A context shift on a ring moves only the window's rows; the logits after it equal those of
  // the shift that moves every row.
  KvCache sr = x.model->make_cache(128, ring_config());
  KvCache sf = x.model->make_cache(128, full_config());
  one_by_one(x, sr, head);
  one_by_one(x, sf, head);
  x.model->shift_context(sr, 4, 10);
  x.model->shift_context(sf, 4, 10);
  EXPECT_EQ(sr.n_past(), 20);
  EXPECT_EQ(one_by_one(x, sr, goes), one_by_one(x, sf, goes));
}

}  // namespace
