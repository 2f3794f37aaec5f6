// The GPU forward (-ngl) on every tiny-qwen3moe-sv model and both golden prompts, with routing
// forced to llama.cpp's experts and teacher-forced decode steps (README §7 of the test data):
// logits within the same bounds as the CPU golden test, against the goldens and against our CPU
// path, in three placements: every expert in VRAM; every expert on the CPU (-cmoe, no pool);
// the first two layers' experts on the CPU with a small VRAM pool, so one layer mixes GPU hits
// and CPU misses. Also the clear errors of the GPU path. Skips, saying why, without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/gpu/qwen35moe_gpu.h"
#include "coordinator/gpu/qwen3moe_gpu.h"
#include "coordinator/model/forced_routing.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/residency/routing_profile.h"
#include "experts/cpu_expert_executor.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/cuda/gpu_test_env.h"
#include "tests/gpu/gpu_golden_util.h"
#include "tests/model/golden_driver.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using namespace moe::model;
using moe::gpu::GpuOptions;
using moe::gpu::Qwen3MoeGpu;
using moe::test::Diff;
using moe::test::Golden;
using moe::test::golden_rows;
using moe::test::load_golden;
using moe::test::run_forced;
using namespace moe::test::gpu;

const std::vector<std::string>& kModels = kQwen3MoeModels;

class GpuGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuGolden, MatchesGoldensAndCpuPath) {
  REQUIRE_GPU();
  const std::string stem = "tiny-qwen3moe-sv-" + GetParam();
  const fs::path root = moe::test::testdata_dir();
  const fs::path path = root / "models" / (stem + ".gguf");
  // scripts/gpu-check carries a few models per call (the GPU machine takes 64 MiB of files).
  if (!fs::exists(path)) GTEST_SKIP() << stem << " is not in this data set (" << root << ")";
  const auto file = moe::gguf::GgufFile::open(path.string());
  moe::cpu::ThreadPool pool(2);
  auto cpu = create_model_arch(file, pool);
  const bool f16 = GetParam() == "F16";
  // The CPU golden test's bounds for exact-arithmetic implementations (README §7).
  const double tol_max = f16 ? 0.05 : 0.6, tol_rms = f16 ? 0.01 : 0.1;
  for (const char* prompt : {"raw", "chat"}) {
    const fs::path dir = root / "golden" / stem / prompt;
    const Golden g = load_golden(dir);
    const std::vector<float> gold = golden_rows(g);
    const std::vector<float> ref = run_forced(*cpu, g, KvType::F32);
    ASSERT_EQ(ref.size(), gold.size());
    for (const Placement& p : kPlacements) {
      SCOPED_TRACE(stem + "/" + prompt + " [" + p.name + "]");
      Qwen3MoeGpu gpu(file, pool, nullptr, options(p));
      const std::vector<float> got = run_forced(gpu, g, KvType::F32);
      ASSERT_EQ(got.size(), gold.size());
      Diff vs_gold, vs_cpu;
      vs_gold.add(got.data(), gold.data(), static_cast<int64_t>(got.size()));
      vs_cpu.add(got.data(), ref.data(), static_cast<int64_t>(got.size()));
      std::printf("%-28s %-4s %-22s vs golden max %.4f rms %.5f | vs CPU max %.4f rms %.5f\n",
                  stem.c_str(), prompt, p.name, vs_gold.max, vs_gold.rms(), vs_cpu.max,
                  vs_cpu.rms());
      EXPECT_LE(vs_gold.max, tol_max);
      EXPECT_LE(vs_gold.rms(), tol_rms);
      EXPECT_LE(vs_cpu.max, tol_max);
      EXPECT_LE(vs_cpu.rms(), tol_rms);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllModels, GpuGolden, ::testing::ValuesIn(kModels), [](const auto& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
});

// Quantized KV caches on the GPU agree with the same cache types on the CPU.
TEST(GpuModel, QuantizedKvCacheMatchesCpu) {
  REQUIRE_GPU();
  const std::string q = any_qwen3moe_model();
  const auto file = moe::gguf::GgufFile::open(qwen3moe_model_path(q).string());
  moe::cpu::ThreadPool pool(2);
  auto cpu = create_model_arch(file, pool);
  Qwen3MoeGpu gpu(file, pool, nullptr, options(kPlacements[0]));
  const fs::path dir = moe::test::testdata_dir() / "golden" / ("tiny-qwen3moe-sv-" + q) / "raw";
  const moe::test::Golden g = moe::test::load_golden(dir);
  for (const moe::test::gpu::KvCase& c : moe::test::gpu::kv_cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<float> a = run_forced(*cpu, g, c.kv);
    const std::vector<float> b = run_forced(gpu, g, c.kv);
    Diff d;
    d.add(b.data(), a.data(), static_cast<int64_t>(a.size()));
    std::printf("KV %-32s GPU vs CPU max %.4f rms %.5f\n", c.name, d.max, d.rms());
    // The GPU keeps activations in f32 where the CPU rounds them to Q8_0 / Q8_K (f16 cache:
    // 0.33 / 0.06 apart on Q4_K_M); q4_0's steps turn those differences into whole rounding
    // steps of the cache, measured up to 1.14 / 0.16, rotated or not. A missing or wrong rotation
    // or decode moves logits by whole units.
    const auto coarse = [](KvType t) {
      return t != KvType::F16 && t != KvType::BF16 && t != KvType::Q8_0;
    };
    const bool q4 = coarse(c.kv.k) || coarse(c.kv.v);  // 4- and 5-bit caches
    EXPECT_LE(d.max, q4 ? 1.5 : 0.6);
    EXPECT_LE(d.rms(), q4 ? 0.25 : 0.1);
  }
}

// A health probe between two steps of a running sequence must not disturb it.
TEST(GpuModel, InterleavedSequencesKeepTheirState) {
  REQUIRE_GPU();
  const auto file = moe::gguf::GgufFile::open(qwen3moe_model_path(any_qwen3moe_model()).string());
  moe::cpu::ThreadPool pool(2);
  Qwen3MoeGpu gpu(file, pool, nullptr, options(kPlacements[0]));
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  const int64_t V = gpu.config().n_vocab;
  std::vector<float> alone(static_cast<size_t>(V)), mixed(static_cast<size_t>(V));
  {
    KvCache c = gpu.make_cache(64, KvType::F16, KvType::F16);
    gpu.forward(prompt, c, LogitsMode::Last, alone.data(), nullptr);
    const int32_t next = 9;
    gpu.forward(std::span<const int32_t>(&next, 1), c, LogitsMode::Last, alone.data(), nullptr);
  }
  {
    KvCache c = gpu.make_cache(64, KvType::F16, KvType::F16);
    gpu.forward(prompt, c, LogitsMode::Last, mixed.data(), nullptr);
    KvCache probe = gpu.make_cache(1, KvType::F16, KvType::F16);
    const int32_t one = 42;
    std::vector<float> tmp(static_cast<size_t>(V));
    gpu.forward(std::span<const int32_t>(&one, 1), probe, LogitsMode::Last, tmp.data(), nullptr);
    const int32_t next = 9;
    gpu.forward(std::span<const int32_t>(&next, 1), c, LogitsMode::Last, mixed.data(), nullptr);
  }
  for (int64_t i = 0; i < V; ++i)
    ASSERT_EQ(alone[static_cast<size_t>(i)], mixed[static_cast<size_t>(i)]) << i;
}

// The prompt cache on the GPU: a sequence rewound to a prefix (KvCache::truncate) after other
// tokens and decode steps, then continued, gives the logits of a fresh sequence evaluated in the
// same batches, in every placement (the rows past the prefix are written again; the decode graphs
// read the position on the device). A probe's sequence in between must not take its slot.
TEST(GpuModel, RewoundSequenceMatchesAFreshOne) {
  REQUIRE_GPU();
  const auto file = moe::gguf::GgufFile::open(qwen3moe_model_path(any_qwen3moe_model()).string());
  moe::cpu::ThreadPool pool(2);
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 24; ++i) prompt.push_back(100 + 11 * i);
  const std::span<const int32_t> all(prompt);
  const size_t k = 10;
  for (const Placement& p : kPlacements) {
    Qwen3MoeGpu gpu(file, pool, nullptr, options(p));
    const auto V = static_cast<size_t>(gpu.config().n_vocab);
    const auto continue_from_prefix = [&](KvCache& c) {
      std::vector<float> out, row(V);
      gpu.forward(all.subspan(k), c, LogitsMode::Last, row.data(), nullptr);
      out.insert(out.end(), row.begin(), row.end());
      for (int32_t t : {7, 8, 9, 10}) {
        gpu.forward(std::span<const int32_t>(&t, 1), c, LogitsMode::Last, row.data(), nullptr);
        out.insert(out.end(), row.begin(), row.end());
      }
      return out;
    };
    std::vector<float> row(V);
    KvCache fresh = gpu.make_cache(128, KvType::F16, KvType::F16);
    gpu.forward(all.first(k), fresh, LogitsMode::Last, row.data(), nullptr);
    const std::vector<float> want = continue_from_prefix(fresh);

    KvCache reused = gpu.make_cache(128, KvType::F16, KvType::F16);
    gpu.forward(all.first(k), reused, LogitsMode::Last, row.data(), nullptr);
    const std::vector<int32_t> other = {5, 6, 7, 8, 9, 10, 11};
    gpu.forward(other, reused, LogitsMode::Last, row.data(), nullptr);
    for (int32_t t : {3, 4, 5}) {
      gpu.forward(std::span<const int32_t>(&t, 1), reused, LogitsMode::Last, row.data(), nullptr);
    }
    KvCache probe = gpu.make_cache(1, KvType::F16, KvType::F16);
    const int32_t one = 42;
    gpu.forward(std::span<const int32_t>(&one, 1), probe, LogitsMode::Last, row.data(), nullptr);
    reused.truncate(static_cast<int64_t>(k));
    const std::vector<float> got = continue_from_prefix(reused);
    ASSERT_EQ(got.size(), want.size());
    Diff d;
    d.add(got.data(), want.data(), static_cast<int64_t>(want.size()));
    std::printf("rewound vs fresh (%s): max %.3g\n", p.name, d.max);
    // With a pool, the misses admitted meanwhile run on the GPU instead of the CPU: the golden
    // bounds between the two. Otherwise the same kernels see the same inputs.
    EXPECT_LE(d.max, p.resident_mib > 0 ? 0.6 : 1e-3) << p.name;
  }
}

// Decode steps replayed from CUDA graphs (every expert in VRAM) give the kernel-by-kernel logits
// bit for bit: across attention split counts (the graph's grid is fixed, the position is read on
// the device), after a longer prompt moved the scratch (the graphs are recorded again) and with a
// health probe's sequence interleaved (one graph per sequence slot).
TEST(GpuModel, CudaGraphDecodeMatchesKernelByKernel) {
  REQUIRE_GPU();
  const auto file = moe::gguf::GgufFile::open(qwen3moe_model_path(any_qwen3moe_model()).string());
  moe::cpu::ThreadPool pool(2);
  GpuOptions plain_opt = options(kPlacements[0]);
  plain_opt.cuda_graphs = false;
  Qwen3MoeGpu graphed(file, pool, nullptr, options(kPlacements[0]));
  Qwen3MoeGpu plain(file, pool, nullptr, plain_opt);
  const auto run = [&](Qwen3MoeGpu& m, const std::vector<int32_t>& prompt, int64_t steps) {
    GenerateOptions opt;
    opt.n_steps = steps;
    opt.keep_logits = true;
    KvCache c = m.make_cache(512, KvType::F16, KvType::Q8_0);
    GenerateResult r = generate(m, c, prompt, opt);
    // A one-token probe on another sequence, then one more step of this one.
    KvCache probe = m.make_cache(8, KvType::F16, KvType::F16);
    const int32_t one = 42;
    std::vector<float> tmp(static_cast<size_t>(m.config().n_vocab));
    m.forward(std::span<const int32_t>(&one, 1), probe, LogitsMode::Last, tmp.data(), nullptr);
    const int32_t next = r.tokens.back();
    m.forward(std::span<const int32_t>(&next, 1), c, LogitsMode::Last, tmp.data(), nullptr);
    r.logits.insert(r.logits.end(), tmp.begin(), tmp.end());
    return r;
  };
  const std::vector<int32_t> short_prompt = {785, 272, 391, 275, 278, 315, 434, 81};
  std::vector<int32_t> long_prompt;
  for (int32_t i = 0; i < 40; ++i) long_prompt.push_back(100 + 7 * i);
  const std::vector<int32_t>* prompts[] = {&short_prompt, &long_prompt};
  for (const std::vector<int32_t>* prompt : prompts) {
    const GenerateResult a = run(graphed, *prompt, 150);  // 150+ positions: 3 attention splits
    const GenerateResult b = run(plain, *prompt, 150);
    EXPECT_EQ(a.tokens, b.tokens);
    ASSERT_EQ(a.logits.size(), b.logits.size());
    Diff d;
    d.add(a.logits.data(), b.logits.data(), static_cast<int64_t>(b.logits.size()));
    std::printf("CUDA graph vs kernel by kernel (prompt %zu): max %.3g\n", prompt->size(), d.max);
    EXPECT_EQ(d.max, 0.0);
  }
}

// Decode steps that stream their misses over PCIe (--moe-stream-share) compute them with the same
// kernels as experts resident in VRAM: streaming every miss gives the all-in-VRAM logits bit for
// bit, and streaming half of them (the CPU computes the rest), or as many as the latency profiler
// picks, stays within the golden bounds of them. Every token is fed alone, so every step is a
// decode step.
TEST(GpuModel, StreamedMissesMatchResidentExperts) {
  REQUIRE_GPU();
  const std::string q = any_qwen3moe_model();
  // Streaming page-locks the model, which must be read into memory, not mapped.
  const auto mapped = moe::gguf::GgufFile::open(qwen3moe_model_path(q).string());
  moe::cpu::ThreadPool pool(2);
  GpuOptions opt = options(kPlacements[1]);
  opt.moe_stream_share = 0.5;
  moe::test::expect_error([&] { Qwen3MoeGpu m(mapped, pool, nullptr, opt); }, "-mmp 0");
  const auto file =
      moe::gguf::GgufFile::open(qwen3moe_model_path(q).string(), moe::gguf::LoadMode::Loaded);
  const fs::path dir = moe::test::testdata_dir() / "golden" / ("tiny-qwen3moe-sv-" + q) / "raw";
  const auto one_by_one = [&](ModelArch& m) {
    const auto prompt = moe::test::read_raw<int32_t>(dir / "prompt_tokens.i32");
    ForcedRouting forced(dir.string(), m.config().n_layer, m.config().n_expert_used);
    const ForwardHooks hooks = forced.hooks();
    KvCache cache = m.make_cache(512, KvType::F32, KvType::F32);
    std::vector<float> out, row(static_cast<size_t>(m.config().n_vocab));
    for (const int32_t t : prompt) {
      m.forward(std::span<const int32_t>(&t, 1), cache, LogitsMode::Last, row.data(), &hooks);
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
  };
  Qwen3MoeGpu resident(file, pool, nullptr, options(kPlacements[0]));
  const std::vector<float> want = one_by_one(resident);
  GpuOptions all = options(kPlacements[1]);  // -cmoe, no pool
  all.moe_stream_share = 1.0;
  Qwen3MoeGpu streamed(file, pool, nullptr, all);
  EXPECT_NE(streamed.describe().find("streamed over PCIe"), std::string::npos)
      << streamed.describe();
  const std::vector<float> got = one_by_one(streamed);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  GpuOptions half = all;
  half.moe_stream_share = 0.5;
  Qwen3MoeGpu mixed(file, pool, nullptr, half);
  const std::vector<float> mix = one_by_one(mixed);
  Diff d;
  d.add(mix.data(), want.data(), static_cast<int64_t>(want.size()));
  std::printf("stream share 0.5 vs resident: max %.4f rms %.5f\n", d.max, d.rms());
  EXPECT_LE(d.max, 0.6);
  EXPECT_LE(d.rms(), 0.1);
  // --moe-stream-share auto: the split comes from measured rates; old and new both stay within
  // the same bounds, and the placement line reports the mode (and the rates once measured).
  for (const bool newer : {false, true}) {
    GpuOptions prof = options(kPlacements[1]);
    prof.moe_stream_share = -1;  // auto
    prof.moe_profiler_new = newer;
    Qwen3MoeGpu profiled(file, pool, nullptr, prof);
    const std::vector<float> p = one_by_one(profiled);
    Diff dp;
    dp.add(p.data(), want.data(), static_cast<int64_t>(want.size()));
    std::printf("%s profiler vs resident: max %.4f rms %.5f; %s\n", newer ? "new" : "old", dp.max,
                dp.rms(), profiled.describe().c_str());
    EXPECT_LE(dp.max, 0.6);
    EXPECT_LE(dp.rms(), 0.1);
    EXPECT_NE(profiled.describe().find(newer ? "split from measured rates (new)"
                                             : "split from measured rates (old)"),
              std::string::npos)
        << profiled.describe();
    // -cmoe without a pool: nothing resident; the old profiler copies at least one miss a visit.
    const std::string st = profiled.runtime_stats();
    EXPECT_NE(st.find(" 0.0% on VRAM copies"), std::string::npos) << st;
    if (!newer) {
      EXPECT_EQ(st.find(" 0.0% copied over PCIe"), std::string::npos) << st;
    }
  }
}

// Decode misses copied over PCIe enter the pool when they are hotter than the expert they displace
// (LFRU admission), in one pool across layers or in per-layer ranges: the logits stay bit for bit
// those of streaming every miss through staging slots (the same kernels, whichever slot the
// weights are read from), and the stats count the admissions.
TEST(GpuModel, AdmittedMissesJoinThePoolInBothGroupings) {
  REQUIRE_GPU();
  const std::string q = any_qwen3moe_model();
  const auto file =
      moe::gguf::GgufFile::open(qwen3moe_model_path(q).string(), moe::gguf::LoadMode::Loaded);
  moe::cpu::ThreadPool pool(2);
  const fs::path dir = moe::test::testdata_dir() / "golden" / ("tiny-qwen3moe-sv-" + q) / "raw";
  const auto prompt = moe::test::read_raw<int32_t>(dir / "prompt_tokens.i32");
  const auto one_by_one = [&](ModelArch& m) {
    KvCache cache = m.make_cache(512, KvType::F32, KvType::F32);
    std::vector<float> out, row(static_cast<size_t>(m.config().n_vocab));
    for (const int32_t t : prompt) {
      m.forward(std::span<const int32_t>(&t, 1), cache, LogitsMode::Last, row.data());
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
  };
  // The reference streams every miss without a pool: routed on the host like the runs below (a
  // fully resident layer routes on the device, whose softmax differs in the last bits).
  GpuOptions staged_only = options(kPlacements[1]);
  staged_only.moe_stream_share = 1.0;
  Qwen3MoeGpu staged(file, pool, nullptr, staged_only);
  const std::vector<float> want = one_by_one(staged);
  for (const bool layout : {false, true}) {
    GpuOptions opt = options(kPlacements[1]);  // -cmoe ...
    opt.moe_resident_mib = 1;                  // ... with a small pool
    opt.moe_stream_share = 1.0;                // every miss copied: admitted or staged
    opt.moe_grouping_layout = layout;
    Qwen3MoeGpu m(file, pool, nullptr, opt);
    EXPECT_NE(m.describe().find(layout ? "per-layer ranges" : "one pool across layers"),
              std::string::npos)
        << m.describe();
    const std::vector<float> got = one_by_one(m);
    ASSERT_EQ(got.size(), want.size());
    Diff d;
    d.add(got.data(), want.data(), static_cast<int64_t>(want.size()));
    std::printf("%s vs staged: max %.3g rms %.3g\n", layout ? "layout" : "off", d.max, d.rms());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << (layout ? "layout" : "off");
    const std::string st = m.runtime_stats();
    std::printf("%s: %s\n", layout ? "layout" : "off", st.c_str());
    EXPECT_NE(st.find("admitted into the pool"), std::string::npos) << st;
    EXPECT_NE(st.find(" 0.0% on the CPU"), std::string::npos) << st;
  }
}

// The machine's rates are measured at the first start (PCIe, GPU and CPU time per expert), saved
// to the calibration cache and loaded by the next start; --recalibrate measures again, and a
// corrupt cache is replaced with a warning instead of failing the start.
TEST(GpuModel, CalibrationIsMeasuredOnceThenCached) {
  REQUIRE_GPU();
  const fs::path cache = fs::temp_directory_path() / ("moe_gpu_cal_" + std::to_string(getpid()));
  fs::remove_all(cache);
  ASSERT_EQ(setenv("MOE_CACHE_DIR", cache.c_str(), 1), 0);
  const auto file = moe::gguf::GgufFile::open(qwen3moe_model_path(any_qwen3moe_model()).string(),
                                              moe::gguf::LoadMode::Loaded);
  moe::cpu::ThreadPool pool(2);
  GpuOptions opt = options(kPlacements[1]);
  opt.moe_stream_share = -1;  // auto: the profiler starts from the calibration
  const auto describe = [&](const GpuOptions& o) {
    return Qwen3MoeGpu(file, pool, nullptr, o).describe();
  };
  const std::string first = describe(opt);
  std::printf("%s\n", first.c_str());
  EXPECT_NE(first.find("calibration (measured at start): PCIe "), std::string::npos) << first;
  EXPECT_NE(first.find("us/expert at 2 threads"), std::string::npos) << first;
  // Seeded from the calibration: the profiler has rates before the first visit.
  EXPECT_EQ(first.find("not measured yet"), std::string::npos) << first;
  ASSERT_TRUE(fs::exists(cache / "calibration.json"));
  const std::string second = describe(opt);
  EXPECT_NE(second.find("calibration (cached "), std::string::npos) << second;
  GpuOptions again = opt;
  again.recalibrate = true;
  EXPECT_NE(describe(again).find("calibration (measured at start)"), std::string::npos);
  {
    std::FILE* f = std::fopen((cache / "calibration.json").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("{not json", f);
    std::fclose(f);
  }
  EXPECT_NE(describe(opt).find("calibration (measured at start)"), std::string::npos);
  EXPECT_NE(describe(opt).find("calibration (cached "), std::string::npos);
  unsetenv("MOE_CACHE_DIR");
  fs::remove_all(cache);
}

// A prefill batch streams every CPU-homed expert through the staging slots, half of them copied
// while the other half is computed: its logits are those with every expert in VRAM (the same
// kernels; only how the groups are split into launches differs). Four slots make eight chunks of
// two experts per layer, so every half is reused, within a layer and across layers.
TEST(GpuModel, StreamedPrefillMatchesResidentExperts) {
  REQUIRE_GPU();
  const std::string q = any_qwen3moe_model();
  const auto file =
      moe::gguf::GgufFile::open(qwen3moe_model_path(q).string(), moe::gguf::LoadMode::Loaded);
  moe::cpu::ThreadPool pool(2);
  const fs::path dir = moe::test::testdata_dir() / "golden" / ("tiny-qwen3moe-sv-" + q) / "raw";
  const auto prompt = moe::test::read_raw<int32_t>(dir / "prompt_tokens.i32");
  ASSERT_FALSE(prompt.empty());
  std::vector<int32_t> batch;
  while (batch.size() < 48) batch.insert(batch.end(), prompt.begin(), prompt.end());
  batch.resize(48);
  // A prefill, three decode steps (their misses streamed through the same slots), and a second
  // prefill on a new sequence: slots pass between the copy stream and decode steps both ways.
  const auto prefill = [&](ModelArch& m) {
    const auto V = static_cast<size_t>(m.config().n_vocab);
    KvCache cache = m.make_cache(512, KvType::F32, KvType::F32);
    std::vector<float> out(batch.size() * V), row(V);
    m.forward(batch, cache, LogitsMode::All, out.data());
    for (size_t i = 0; i < 3; ++i) {
      m.forward(std::span<const int32_t>(&batch[i], 1), cache, LogitsMode::Last, row.data());
      out.insert(out.end(), row.begin(), row.end());
    }
    KvCache second = m.make_cache(512, KvType::F32, KvType::F32);
    const std::span<const int32_t> tail(batch.data() + 8, 40);
    row.resize(V * tail.size());
    m.forward(tail, second, LogitsMode::All, row.data());
    out.insert(out.end(), row.begin(), row.end());
    return out;
  };
  // Every instance routes and groups on the host (batches on fully resident layers would group
  // on the device, whose launches are bounded by the batch's tokens rather than its largest
  // group): streaming alone is compared, bit for bit in practice.
  GpuOptions resident_opt = options(kPlacements[0]);
  resident_opt.moe_host_routing = true;
  Qwen3MoeGpu resident(file, pool, nullptr, resident_opt);
  const std::vector<float> want = prefill(resident);
  for (const int placement : {1, 2}) {  // -cmoe without a pool; -ncmoe 2 with a 1 MiB pool
    GpuOptions opt = options(kPlacements[placement]);
    opt.moe_host_routing = true;
    opt.moe_staging_slots = 4;
    opt.moe_stream_share = 1.0;       // decode computes every miss from the slots too
    opt.moe_prefill_cpu_share = 0.0;  // the prefill streams every CPU-homed expert
    Qwen3MoeGpu streamed(file, pool, nullptr, opt);
    EXPECT_NE(streamed.describe().find("prefill batches"), std::string::npos)
        << streamed.describe();
    const std::vector<float> got = prefill(streamed);
    ASSERT_EQ(got.size(), want.size());
    Diff d;
    d.add(got.data(), want.data(), static_cast<int64_t>(want.size()));
    std::printf("%s, prefill streamed vs resident: max %.3g rms %.3g\n",
                kPlacements[placement].name, d.max, d.rms());
    EXPECT_LE(d.max, 1e-4);
  }
  for (const int64_t streams : {1, 2, 3}) {
    // A ring of three chunks of two experts: each chunk's copy waits for the computation of the
    // chunk three before it, across layers too; with several copy streams, chunks in flight on
    // different streams complete in any order.
    GpuOptions opt = options(kPlacements[1]);
    opt.moe_host_routing = true;
    opt.moe_staging_slots = 6;
    opt.moe_staging_chunk = 2;
    opt.moe_copy_streams = streams;
    opt.moe_stream_share = 1.0;
    opt.moe_prefill_cpu_share = 0.0;
    Qwen3MoeGpu ring(file, pool, nullptr, opt);
    EXPECT_NE(ring.describe().find(std::to_string(streams) + " copy stream"), std::string::npos)
        << ring.describe();
    const std::vector<float> got = prefill(ring);
    ASSERT_EQ(got.size(), want.size());
    Diff d;
    d.add(got.data(), want.data(), static_cast<int64_t>(want.size()));
    std::printf(
        "-cmoe, prefill streamed through a ring of 3 chunks on %lld copy streams vs resident: "
        "max %.3g\n",
        static_cast<long long>(streams), d.max);
    EXPECT_LE(d.max, 1e-4);
  }
  GpuOptions odd = options(kPlacements[1]);
  odd.moe_staging_slots = 3;
  moe::test::expect_error([&] { Qwen3MoeGpu m(file, pool, nullptr, odd); }, "staging slots");
  GpuOptions uneven = options(kPlacements[1]);
  uneven.moe_staging_slots = 4;
  uneven.moe_staging_chunk = 3;
  moe::test::expect_error([&] { Qwen3MoeGpu m(file, pool, nullptr, uneven); }, "staging chunk");
  GpuOptions no_streams = options(kPlacements[1]);
  no_streams.moe_copy_streams = 0;
  moe::test::expect_error([&] { Qwen3MoeGpu m(file, pool, nullptr, no_streams); }, "copy streams");
}

// A streamed prefill whose CPU computes a share of each layer's CPU-homed experts (a fixed share,
// every one, or the share balanced from measured times) stays within the golden bounds, against
// the goldens and the CPU path, with llama.cpp's routing forced (the golden prompts are 40 and 48
// tokens: they stream); the CPU's activations are quantized where the GPU's are not. A ring of
// small chunks is still consumed when the CPU takes every routed item of a layer.
TEST(GpuModel, PrefillCpuShareMatchesGoldens) {
  REQUIRE_GPU();
  const std::string q = any_qwen3moe_model();
  const auto file =
      moe::gguf::GgufFile::open(qwen3moe_model_path(q).string(), moe::gguf::LoadMode::Loaded);
  moe::cpu::ThreadPool pool(2);
  auto cpu = create_model_arch(file, pool);
  const bool f16 = q == "F16";
  const double tol_max = f16 ? 0.05 : 0.6, tol_rms = f16 ? 0.01 : 0.1;
  for (const char* prompt : {"raw", "chat"}) {
    const fs::path dir = moe::test::testdata_dir() / "golden" / ("tiny-qwen3moe-sv-" + q) / prompt;
    const Golden g = load_golden(dir);
    const std::vector<float> gold = golden_rows(g);
    const std::vector<float> ref = run_forced(*cpu, g, KvType::F32);
    for (const double share : {0.5, 1.0, -1.0}) {
      SCOPED_TRACE(std::string(prompt) + ", prefill CPU share " + std::to_string(share));
      GpuOptions opt = options(kPlacements[1]);  // -cmoe, no pool
      opt.moe_staging_slots = 8;
      opt.moe_staging_chunk = 2;
      opt.moe_prefill_cpu_share = share;
      Qwen3MoeGpu split(file, pool, nullptr, opt);
      const std::vector<float> got = run_forced(split, g, KvType::F32);
      ASSERT_EQ(got.size(), gold.size());
      Diff vs_gold, vs_cpu;
      vs_gold.add(got.data(), gold.data(), static_cast<int64_t>(got.size()));
      vs_cpu.add(got.data(), ref.data(), static_cast<int64_t>(got.size()));
      const std::string st = split.runtime_stats();
      std::printf(
          "%s, prefill CPU share %.1f: vs golden max %.4f rms %.5f | vs CPU max %.4f rms "
          "%.5f; %s\n",
          prompt, share, vs_gold.max, vs_gold.rms(), vs_cpu.max, vs_cpu.rms(), st.c_str());
      EXPECT_LE(vs_gold.max, tol_max);
      EXPECT_LE(vs_gold.rms(), tol_rms);
      EXPECT_LE(vs_cpu.max, tol_max);
      EXPECT_LE(vs_cpu.rms(), tol_rms);
      // Every mode gives the CPU experts: auto starts with one to time it.
      EXPECT_NE(st.find("computed on the CPU instead"), std::string::npos) << st;
    }
  }
}

// The CPU's share computed on the runner thread the GPU stream waits on gives the logits of the
// synchronous hand-off bit for bit (same kernels, same order of additions); a CPU share that fails
// mid-forward fails that forward with its error, without a hang, and the model stays usable.
TEST(GpuModel, CpuShareHandOffMatchesSynchronousAndSurvivesErrors) {
  REQUIRE_GPU();
  const auto file = moe::gguf::GgufFile::open(qwen3moe_model_path(any_qwen3moe_model()).string());
  moe::cpu::ThreadPool pool(2);
  const std::vector<int32_t> prompt = {785, 272, 391, 275, 278, 315, 434, 81};
  GenerateOptions gen;
  gen.n_steps = 12;
  gen.keep_logits = true;
  for (const int placement : {1, 2}) {  // -cmoe; -ncmoe 2 with a pool (GPU hits and CPU misses)
    const std::string name = kPlacements[placement].name;
    GpuOptions sync_opt = options(kPlacements[placement]);
    sync_opt.moe_cpu_sync = true;
    // Host routing throughout (a batch on the resident layers would otherwise group on the
    // device): the reference the runner thread's host-routed share matches bit for bit.
    sync_opt.moe_host_routing = true;
    sync_opt.moe_direct_share = 0;
    Qwen3MoeGpu sync(file, pool, nullptr, sync_opt);
    EXPECT_NE(sync.describe().find("the GPU's host thread"), std::string::npos) << sync.describe();
    KvCache a = sync.make_cache(64, KvType::F16, KvType::F16);
    const GenerateResult want = generate(sync, a, prompt, gen);

    // The runner thread with host routing: the same bits as the synchronous share; then with
    // routing on the device (the default), which publishes it to the runner: the same tokens,
    // logits within the device router's rounding. Both survive a failing CPU share.
    for (const bool host_routing : {true, false}) {
      SCOPED_TRACE(name + (host_routing ? ", host routing" : ", device routing"));
      GpuOptions opt = options(kPlacements[placement]);
      opt.moe_host_routing = host_routing;
      opt.moe_direct_share = 0;  // every miss on the CPU share (no reads in place by the GPU)
      auto failing = std::make_unique<FailingExecutor>(moe::model::cpu_experts_for(file, pool));
      FailingExecutor* fail = failing.get();
      Qwen3MoeGpu async(file, pool, std::move(failing), opt);
      EXPECT_NE(async.describe().find("runner thread"), std::string::npos) << async.describe();
      KvCache b = async.make_cache(64, KvType::F16, KvType::F16);
      const GenerateResult got = generate(async, b, prompt, gen);
      EXPECT_EQ(got.tokens, want.tokens);
      ASSERT_EQ(got.logits.size(), want.logits.size());
      if (host_routing) {
        EXPECT_EQ(std::memcmp(got.logits.data(), want.logits.data(), got.logits.size() * 4), 0);
      } else {
        double max_diff = 0;
        for (size_t i = 0; i < got.logits.size(); ++i) {
          max_diff =
              std::max(max_diff, static_cast<double>(std::fabs(got.logits[i] - want.logits[i])));
        }
        // The 8-token prompt is routed (and on resident layers grouped) on the device too: the
        // routers' last bits through the CPU's Q8 activations (tests/gpu/gpu_routing_test.cpp).
        EXPECT_LE(max_diff, 0.02);
        EXPECT_NE(async.runtime_stats().find("for the GPU's routing"), std::string::npos)
            << async.runtime_stats();
      }

      // The last CPU-homed layer fails in a decode step and in a prefill; the cache is unchanged.
      fail->fail_at = 1;
      std::vector<float> row(static_cast<size_t>(async.config().n_vocab));
      const int64_t past = b.n_past();
      moe::test::expect_error(
          [&] {
            async.forward(std::span(&prompt[0], 1), b, LogitsMode::Last, row.data(), nullptr);
          },
          "CPU expert worker lost");
      moe::test::expect_error(
          [&] { async.forward(prompt, b, LogitsMode::Last, row.data(), nullptr); },
          "CPU expert worker lost");
      EXPECT_EQ(b.n_past(), past);
      fail->fail_at = -1;
      KvCache c = async.make_cache(64, KvType::F16, KvType::F16);
      const GenerateResult again = generate(async, c, prompt, gen);
      EXPECT_EQ(again.tokens, want.tokens);
    }
  }
}

// --moe-profile FILE: a run saves its routing profile; the next model on the same file starts
// with the pool filled from it and gives logits within the golden bounds of the cold start; a
// profile of another model's shape is refused.
TEST(GpuModel, RoutingProfileStartsThePoolWarm) {
  REQUIRE_GPU();
  const auto file = moe::gguf::GgufFile::open(qwen3moe_model_path(any_qwen3moe_model()).string());
  moe::cpu::ThreadPool pool(2);
  const fs::path prof = fs::temp_directory_path() / ("moe_gpu_profile_" + std::to_string(getpid()));
  fs::remove(prof);
  GpuOptions opt = options(kPlacements[2]);  // -ncmoe 2 with a 1 MiB pool
  opt.moe_profile = prof.string();
  const std::vector<int32_t> prompt = {785, 272, 391, 275, 278, 315, 434, 81};
  GenerateOptions gen;
  gen.n_steps = 8;
  gen.keep_logits = true;
  std::vector<float> cold_logits;
  {
    Qwen3MoeGpu cold(file, pool, nullptr, opt);
    EXPECT_NE(cold.describe().find("(new)"), std::string::npos) << cold.describe();
    KvCache c = cold.make_cache(64, KvType::F16, KvType::F16);
    cold_logits = generate(cold, c, prompt, gen).logits;
  }
  const auto saved = moe::model::RoutingProfile::load(prof.string());
  ASSERT_TRUE(saved.has_value());
  uint64_t routed = 0;
  for (const uint64_t c : saved->counts) routed += c;
  // The first two layers' experts are CPU-homed and routed on the host: at least the prompt's
  // 8 tokens x k experts each.
  const auto k = static_cast<uint64_t>(ModelConfig::from_gguf(file).n_expert_used);
  EXPECT_GE(routed, 2 * 8 * k);
  Qwen3MoeGpu warm(file, pool, nullptr, opt);
  EXPECT_NE(warm.describe().find("loaded ("), std::string::npos) << warm.describe();
  EXPECT_EQ(warm.describe().find("loaded (0 experts"), std::string::npos) << warm.describe();
  KvCache w = warm.make_cache(64, KvType::F16, KvType::F16);
  const std::vector<float> warm_logits = generate(warm, w, prompt, gen).logits;
  ASSERT_EQ(warm_logits.size(), cold_logits.size());
  Diff d;
  d.add(warm_logits.data(), cold_logits.data(), static_cast<int64_t>(cold_logits.size()));
  EXPECT_LE(d.max, 0.6);
  EXPECT_LE(d.rms(), 0.1);

  moe::model::RoutingProfile other{"qwen3moe", 99, 4, std::vector<uint64_t>(99 * 4, 1)};
  other.save(prof.string());
  moe::test::expect_error([&] { Qwen3MoeGpu m(file, pool, nullptr, opt); }, "recorded for a");
  GpuOptions unwritable = opt;
  unwritable.moe_profile = "/nonexistent-dir/profile.json";
  moe::test::expect_error([&] { Qwen3MoeGpu m(file, pool, nullptr, unwritable); },
                          "routing profile /nonexistent-dir/profile.json");
  fs::remove(prof);
}

TEST(GpuModel, ClearErrors) {
  REQUIRE_GPU();
  const auto file = moe::gguf::GgufFile::open(qwen3moe_model_path(any_qwen3moe_model()).string());
  moe::cpu::ThreadPool pool(1);
  GpuOptions partial = options(kPlacements[0]);
  partial.n_gpu_layers = 2;
  moe::test::expect_error([&] { Qwen3MoeGpu g(file, pool, nullptr, partial); }, "partial offload");
  GpuOptions tiny = options(kPlacements[0]);
  tiny.vram_budget_mib = 1;
  moe::test::expect_error([&] { Qwen3MoeGpu g(file, pool, nullptr, tiny); },
                          "VRAM budget exceeded");

  Qwen3MoeGpu gpu(file, pool, nullptr, options(kPlacements[0]));
  std::vector<float> logits(static_cast<size_t>(gpu.config().n_vocab));
  const std::vector<int32_t> toks = {1, 2, 3};
  // Every KvType the host cache knows (f32, f16, q8_0, q4_0) runs on the GPU too: the check in
  // GpuSequenceStates::acquire guards the day a host-only type is added.
  // A cache advanced by another model has no K/V in VRAM.
  auto cpu = create_model_arch(file, pool);
  KvCache c = cpu->make_cache(16, KvType::F16, KvType::F16);
  cpu->forward(toks, c, LogitsMode::Last, logits.data(), nullptr);
  moe::test::expect_error([&] { gpu.forward(toks, c, LogitsMode::Last, logits.data(), nullptr); },
                          "not in VRAM");
  // A bad token id fails cleanly and the model stays usable.
  const std::vector<int32_t> bad = {1, -5};
  KvCache d = gpu.make_cache(16, KvType::F16, KvType::F16);
  moe::test::expect_error([&] { gpu.forward(bad, d, LogitsMode::Last, logits.data(), nullptr); },
                          "out of range");
  gpu.forward(toks, d, LogitsMode::Last, logits.data(), nullptr);
  EXPECT_EQ(d.n_past(), 3);
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); }));
}

}  // namespace
