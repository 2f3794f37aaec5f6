// GpuForward::shift_context (GpuSequenceStates::shift) on a tiny qwen3moe model, exactly: the VRAM
// rows after a GPU shift (export_sequence) equal, byte for byte, the CPU shift (shift_kv) of the
// same rows taken before it, for several cache types, rotated and not; and decoding goes on as
// from those CPU-shifted rows imported into another sequence (bit-identical logits every step),
// through a second shift once the context is full again (decode graphs by then). qwen35moe
// refuses, the sequence unchanged. (Against the CPU forward instead, this random prompt drifts
// past gpu_model_test's GPU-vs-CPU bounds: 1.4 with an f16 cache.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/gpu/qwen35moe_gpu.h"
#include "coordinator/gpu/qwen3moe_gpu.h"
#include "coordinator/model/kv_shift.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/model/sequence_image.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/cuda/gpu_test_env.h"
#include "tests/testdata.h"

namespace moe::gpu {
namespace {

using model::KvCache;
using model::KvConfig;
using model::KvType;
using model::LogitsMode;

GpuOptions options() {
  GpuOptions o;
  o.n_gpu_layers = 99;
  o.n_ctx = 64;
  return o;
}

// The first tiny qwen3moe model present (the device run carries a few).
std::filesystem::path qwen3_model() {
  for (const char* q : {"Q4_K_M", "F16", "Q8_0"}) {
    const auto p =
        test::testdata_dir() / "models" / ("tiny-qwen3moe-sv-" + std::string(q) + ".gguf");
    if (std::filesystem::exists(p)) return p;
  }
  throw std::runtime_error("no tiny qwen3moe model in " + test::testdata_dir().string());
}

// The CPU shift (shift_kv) of the sequence's rows as they are in VRAM now (export_sequence).
model::SequenceImage cpu_shifted(GpuForward& gpu, const KvCache& seq, const KvConfig& kv,
                                 int64_t keep, int64_t discard) {
  model::SequenceImage img;
  gpu.export_sequence(seq, img);
  KvCache host(gpu.config(), seq.n_ctx(), kv);
  host.import_image(img);
  model::shift_kv(host, gpu.config(), keep, discard);
  host.export_image(img);
  return img;
}

TEST(KvShiftGpu, MatchesTheCpuShiftOfTheSameRows) {
  MOE_REQUIRE_GPU();
  const auto file = gguf::GgufFile::open(qwen3_model().string());
  cpu::ThreadPool pool(2);
  Qwen3MoeGpu gpu(file, pool, nullptr, options());
  const int64_t V = gpu.config().n_vocab, n_ctx = 32;
  KvConfig q4_plain = KvConfig::uniform(KvType::Q4_0, KvType::Q4_0);
  q4_plain.rotate = false;
  for (const KvConfig& kv :
       {KvConfig::uniform(KvType::F16, KvType::F16), KvConfig::uniform(KvType::BF16, KvType::Q8_0),
        KvConfig::uniform(KvType::Q4_0, KvType::Q4_0), q4_plain,
        KvConfig::uniform(KvType::Q5_1, KvType::Q4_1),
        KvConfig::uniform(KvType::IQ4_NL, KvType::IQ4_NL)}) {
    SCOPED_TRACE(std::string(model::kv_type_name(kv.k)) + " K, " +
                 std::string(model::kv_type_name(kv.v)) + " V" + (kv.rotate ? ", rotated" : ""));
    KvCache seq = gpu.make_cache(n_ctx, kv), ref = gpu.make_cache(n_ctx, kv);
    std::vector<float> logits(static_cast<size_t>(V)), ref_logits(logits.size());
    std::vector<int32_t> prompt;
    for (int32_t i = 0; i < 20; ++i) prompt.push_back(1 + 37 * i % static_cast<int32_t>(V - 1));
    gpu.forward(prompt, seq, LogitsMode::Last, logits.data(), nullptr);
    // Shifts at n_past 20 (keep 3, drop 6) and, after decoding to the full 32, keep 5, drop 13.
    int shifts = 0;
    for (int step = 0; step < 40; ++step) {
      if (seq.n_past() == (shifts == 0 ? 20 : n_ctx)) {
        if (shifts == 2) break;  // full again after the second shift: done
        const int64_t keep = shifts == 0 ? 3 : 5, discard = shifts == 0 ? 6 : 13;
        const model::SequenceImage want = cpu_shifted(gpu, seq, kv, keep, discard);
        gpu.shift_context(seq, keep, discard);
        model::SequenceImage got;
        gpu.export_sequence(seq, got);
        ASSERT_EQ(seq.n_past(), want.n_past);
        ASSERT_EQ(got.n_past, want.n_past);
        for (size_t l = 0; l < want.layers.size(); ++l) {
          EXPECT_EQ(got.layers[l].k, want.layers[l].k) << "K of layer " << l;
          EXPECT_EQ(got.layers[l].v, want.layers[l].v) << "V of layer " << l;
        }
        gpu.import_sequence(ref, want);  // the reference goes on from the CPU-shifted rows
        ++shifts;
      }
      // The same token into both; after the second shift the sequence's decode graph is
      // recorded again (the slot's generation changed).
      const auto next =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      gpu.forward({&next, 1}, seq, LogitsMode::Last, logits.data(), nullptr);
      if (shifts > 0) {
        gpu.forward({&next, 1}, ref, LogitsMode::Last, ref_logits.data(), nullptr);
        ASSERT_TRUE(logits == ref_logits) << "step " << step << " at position " << seq.n_past();
      }
    }
    EXPECT_EQ(shifts, 2);
    for (const float x : logits) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(KvShiftGpu, RecurrentModelsRefuse) {
  MOE_REQUIRE_GPU();
  const auto path = test::qwen35moe_testdata_dir() / "models" / "tiny-qwen35moe-sv-Q4_K_M.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not in this data set";
  const auto file = gguf::GgufFile::open(path.string());
  cpu::ThreadPool pool(2);
  Qwen35MoeGpu gpu(file, pool, nullptr, options());
  KvCache c = gpu.make_cache(32, KvConfig::uniform(KvType::F16, KvType::F16));
  const std::vector<int32_t> prompt(12, 5);
  std::vector<float> logits(static_cast<size_t>(gpu.config().n_vocab));
  gpu.forward(prompt, c, LogitsMode::Last, logits.data(), nullptr);
  EXPECT_THROW(gpu.shift_context(c, 2, 4), Error);
  EXPECT_EQ(c.n_past(), 12);
  gpu.forward({prompt.data(), 1}, c, LogitsMode::Last, logits.data(), nullptr);
  EXPECT_EQ(c.n_past(), 13);
}

}  // namespace
}  // namespace moe::gpu
