// Continuous batching on the GPU path (GpuForward::forward_batch): several sequences in one
// forward against separate forwards, and batches that fail leaving every sequence as it was.
// Skips, saying why, without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/gguf.h"
#include "coordinator/gpu/qwen35moe_gpu.h"
#include "coordinator/gpu/qwen3moe_gpu.h"
#include "coordinator/model/model_arch.h"
#include "experts/cpu_expert_executor.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/cuda/gpu_test_env.h"
#include "tests/gpu/gpu_golden_util.h"
#include "tests/model/golden_compare.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using namespace moe::model;
using moe::gpu::GpuOptions;
using moe::gpu::Qwen3MoeGpu;
using moe::test::Diff;
using namespace moe::test::gpu;

// Continuous batching (forward_batch): three sequences at different points, one decoding a token
// (A, 7 tokens in), one fresh with a 6-token prompt (B) and one with a 4-token chunk (C, 3 in),
// evaluated as one batch give each sequence's last-token logits of separate forwards, and the
// next step of each still matches (its K/V and recurrent state joined the sequence). A batch that
// fails, before it runs (a bad token in its second chunk, more sequences than VRAM slots) or in
// the middle (a CPU expert share that throws), leaves every sequence where it was. qwen3moe and
// qwen35moe (whose DeltaNet conv window and state run per sequence), with every expert in VRAM,
// every expert on the CPU, and on the CPU with a small VRAM pool (the hybrid split).
TEST(GpuModel, BatchedSequencesMatchSeparateForwards) {
  REQUIRE_GPU();
  struct Model {
    fs::path path;
    bool qwen35;
  };
  const fs::path q35 = moe::test::qwen35moe_testdata_dir() / "models";
  const std::vector<Model> models = {{qwen3moe_model_path("F16"), false},
                                     {qwen3moe_model_path("Q4_K_M"), false},
                                     {q35 / "tiny-qwen35moe-sv-Q4_K_M.gguf", true}};
  GpuOptions pooled = options(kPlacements[1]);
  pooled.moe_resident_mib = 1;
  const std::pair<const char*, GpuOptions> placements[] = {
      {"all experts in VRAM", options(kPlacements[0])},
      {"-cmoe, no pool", options(kPlacements[1])},
      {"-cmoe, 1 MiB pool", pooled}};
  moe::cpu::ThreadPool pool(2);
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < 16; ++i) ids.push_back(100 + 37 * i);
  const std::span<const int32_t> all(ids);
  // Per sequence: the tokens it already holds, its chunk of the batch, its next step.
  struct Seq {
    const char* name;
    std::span<const int32_t> prefix, chunk;
    int32_t next;
  };
  const Seq seqs[] = {{"A", all.first(7), all.subspan(7, 1), 901},
                      {"B", {}, all.subspan(8, 6), 902},
                      {"C", all.first(3), all.subspan(3, 4), 903}};
  const auto make = [&](const moe::gguf::GgufFile& f, bool qwen35, const GpuOptions& o,
                        std::unique_ptr<ExpertExecutor> cpu) -> std::unique_ptr<ModelArch> {
    if (qwen35) return std::make_unique<moe::gpu::Qwen35MoeGpu>(f, pool, std::move(cpu), o);
    return std::make_unique<Qwen3MoeGpu>(f, pool, std::move(cpu), o);
  };
  int ran = 0;
  for (const Model& m : models) {
    if (!fs::exists(m.path)) {
      std::printf("%s: not in this data set\n", m.path.filename().c_str());
      continue;
    }
    ++ran;
    const auto file = moe::gguf::GgufFile::open(m.path.string());
    for (const auto& [pname, popt] : placements) {
      const std::string what = m.path.stem().string() + " [" + pname + "]";
      SCOPED_TRACE(what);
      GpuOptions opt = popt;
      opt.n_seq = 3;
      // The reference: each sequence alone on its own model instance, so that the batched
      // instance's n_seq + 1 VRAM slots hold only the batch's sequences.
      const auto ref = make(file, m.qwen35, opt, nullptr);
      const auto V = static_cast<size_t>(ref->config().n_vocab);
      std::vector<float> want(3 * V), want_next(3 * V), row(V);
      for (size_t i = 0; i < 3; ++i) {
        KvCache c = ref->make_cache(64, KvType::F16, KvType::F16);
        if (!seqs[i].prefix.empty()) {
          ref->forward(seqs[i].prefix, c, LogitsMode::Last, row.data(), nullptr);
        }
        ref->forward(seqs[i].chunk, c, LogitsMode::Last, want.data() + i * V, nullptr);
        ref->forward(std::span<const int32_t>(&seqs[i].next, 1), c, LogitsMode::Last,
                     want_next.data() + i * V, nullptr);
      }

      auto failing = std::make_unique<FailingExecutor>(moe::model::cpu_experts_for(file, pool));
      FailingExecutor* fail = failing.get();
      const auto gpu = make(file, m.qwen35, opt, std::move(failing));
      // A GPU forward ties a VRAM slot to the cache's address: no cache may move.
      std::vector<KvCache> caches;
      caches.reserve(3);
      for (size_t i = 0; i < 3; ++i)
        caches.push_back(gpu->make_cache(64, KvType::F16, KvType::F16));
      for (size_t i = 0; i < 3; ++i) {
        if (!seqs[i].prefix.empty()) {
          gpu->forward(seqs[i].prefix, caches[i], LogitsMode::Last, row.data(), nullptr);
        }
      }
      std::vector<SequenceChunk> batch;
      for (size_t i = 0; i < 3; ++i) batch.push_back({seqs[i].chunk, &caches[i]});
      std::vector<float> got(3 * V);
      gpu->forward_batch(batch, got.data());
      std::vector<int64_t> past;
      for (size_t i = 0; i < 3; ++i) {
        past.push_back(caches[i].n_past());
        EXPECT_EQ(past[i], static_cast<int64_t>(seqs[i].prefix.size() + seqs[i].chunk.size()))
            << seqs[i].name;
      }

      // Failed batches: nothing joins any sequence.
      const std::vector<int32_t> bad = {seqs[1].next, static_cast<int32_t>(V)};
      std::vector<SequenceChunk> steps;
      for (size_t i = 0; i < 3; ++i) {
        steps.push_back({std::span<const int32_t>(&seqs[i].next, 1), &caches[i]});
      }
      std::vector<float> tmp(5 * V);
      std::vector<SequenceChunk> bad_batch = steps;
      bad_batch[1].tokens = bad;
      moe::test::expect_error([&] { gpu->forward_batch(bad_batch, tmp.data()); }, "out of range");
      // Five new sequences for four slots: refused before any of A, B, C loses its slot.
      std::vector<KvCache> extra;
      extra.reserve(5);
      for (int i = 0; i < 5; ++i) extra.push_back(gpu->make_cache(8, KvType::F16, KvType::F16));
      std::vector<SequenceChunk> too_many;
      for (KvCache& c : extra) too_many.push_back({all.first(1), &c});
      moe::test::expect_error([&] { gpu->forward_batch(too_many, tmp.data()); },
                              "VRAM holds the state of at most 4");
      if (opt.cpu_moe && opt.moe_resident_mib == 0) {
        // Every expert on the CPU: the last layer's share fails after every layer before it
        // wrote its K/V rows and recurrent state.
        fail->fail_at = ref->config().n_layer - 1;
        moe::test::expect_error([&] { gpu->forward_batch(steps, tmp.data()); },
                                "CPU expert worker lost");
        fail->fail_at = -1;
      }
      for (size_t i = 0; i < 3; ++i) EXPECT_EQ(caches[i].n_past(), past[i]) << seqs[i].name;

      std::vector<float> got_next(3 * V);
      for (size_t i = 0; i < 3; ++i) {
        gpu->forward(std::span<const int32_t>(&seqs[i].next, 1), caches[i], LogitsMode::Last,
                     got_next.data() + i * V, nullptr);
      }
      // Relative to the logits' scale (about 10 on these models). Batched, the dense products
      // run over 11 rows (the tiled kernel) where alone they take the GEMV: with every expert in
      // VRAM that is rounding, measured up to 0.0011 of the scale (Q4_K_M, both architectures;
      // FP16 operands: the opt-in int8 product measured 0.033), where a wrong row, position or
      // state moves logits by whole units. Experts on the CPU see those differences through their
      // Q8 activations and compute a token alone (GEMV) or with others (GEMM) differently, and the
      // two instances' pools hold different experts at any time: up to 0.029 of the scale measured,
      // within the golden bounds between the GPU and CPU paths (0.6).
      const double tol = opt.cpu_moe ? 0.06 : 0.01;
      for (size_t i = 0; i < 3; ++i) {
        for (const bool next : {false, true}) {
          const float* w = (next ? want_next : want).data() + i * V;
          const float* g = (next ? got_next : got).data() + i * V;
          double scale = 0;
          for (size_t j = 0; j < V; ++j) scale = std::max(scale, std::fabs(double{w[j]}));
          Diff d;
          d.add(g, w, static_cast<int64_t>(V));
          std::printf("%-48s %s %-10s batched vs separate: max %.4g (%.3g of scale %.3g)\n",
                      what.c_str(), seqs[i].name, next ? "next step" : "batch", d.max,
                      d.max / scale, scale);
          EXPECT_LE(d.max, tol * scale) << seqs[i].name << (next ? ", next step" : ", batch");
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "none of the models is in this data set";
}

// Steps of up to 8 rows replayed from CUDA graphs give the kernel-by-kernel logits bit for bit:
// three sequences at different positions stepping one token each (one graph for the three), and
// one sequence verifying drafts of 5 and 3 tokens with every row's logits (grouped by expert on
// the device, and per item), every expert in VRAM; qwen3moe and qwen35moe (one graph per state
// buffer of each sequence).
TEST(GpuModel, GraphedBatchStepsMatchKernelByKernel) {
  REQUIRE_GPU();
  const fs::path q35 = moe::test::qwen35moe_testdata_dir() / "models";
  const std::vector<std::pair<fs::path, bool>> models = {
      {qwen3moe_model_path("Q4_K_M"), false}, {q35 / "tiny-qwen35moe-sv-Q4_K_M.gguf", true}};
  moe::cpu::ThreadPool pool(2);
  int ran = 0;
  for (const auto& [path, qwen35] : models) {
    if (!fs::exists(path)) continue;
    ++ran;
    SCOPED_TRACE(path.filename().string());
    const auto file = moe::gguf::GgufFile::open(path.string());
    const auto run = [&](bool graphs) {
      GpuOptions opt = options(kPlacements[0]);
      opt.n_seq = 3;
      opt.cuda_graphs = graphs;
      std::unique_ptr<ModelArch> m;
      if (qwen35) {
        m = std::make_unique<moe::gpu::Qwen35MoeGpu>(file, pool, nullptr, opt);
      } else {
        m = std::make_unique<Qwen3MoeGpu>(file, pool, nullptr, opt);
      }
      const auto V = static_cast<size_t>(m->config().n_vocab);
      std::vector<KvCache> caches;
      caches.reserve(3);
      for (int i = 0; i < 3; ++i) caches.push_back(m->make_cache(128, KvType::F16, KvType::F16));
      std::vector<float> out, row(V), rows(8 * V);
      const size_t prompt_len[] = {11, 9, 12};
      for (size_t i = 0; i < 3; ++i) {
        std::vector<int32_t> p;
        for (size_t t = 0; t < prompt_len[i]; ++t)
          p.push_back(static_cast<int32_t>(100 + 31 * t + i));
        m->forward(p, caches[i], LogitsMode::Last, row.data(), nullptr);
        out.insert(out.end(), row.begin(), row.end());
      }
      for (int step = 0; step < 12; ++step) {
        int32_t tok[3];
        std::vector<SequenceChunk> batch;
        for (size_t i = 0; i < 3; ++i) {
          tok[i] = static_cast<int32_t>(300 + 7 * step + i);
          batch.push_back({std::span<const int32_t>(&tok[i], 1), &caches[i]});
        }
        std::vector<float> got(3 * V);
        m->forward_batch(batch, got.data());
        out.insert(out.end(), got.begin(), got.end());
      }
      for (const size_t n : {size_t{5}, size_t{3}, size_t{5}}) {
        std::vector<int32_t> draft;
        for (size_t t = 0; t < n; ++t) draft.push_back(static_cast<int32_t>(500 + 13 * t + n));
        m->forward(draft, caches[0], LogitsMode::All, rows.data(), nullptr);
        out.insert(out.end(), rows.begin(), rows.begin() + static_cast<ptrdiff_t>(n * V));
      }
      return out;
    };
    const std::vector<float> graphed = run(true);
    const std::vector<float> plain = run(false);
    ASSERT_EQ(graphed.size(), plain.size());
    Diff d;
    d.add(graphed.data(), plain.data(), static_cast<int64_t>(plain.size()));
    std::printf("%s: graphed batch steps vs kernel by kernel: max %.3g\n", path.filename().c_str(),
                d.max);
    EXPECT_EQ(d.max, 0.0);
  }
  if (ran == 0) GTEST_SKIP() << "none of the models is in this data set";
}

}  // namespace
