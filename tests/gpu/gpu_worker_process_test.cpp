// The routed experts' kernels run in a moe-gpu-worker process (--gpu-executor process) give the
// logits and tokens of the coordinator's own context bit for bit — same kernels, same order, on
// the same memory mapped at the same addresses — for decode routed on the device, layers split
// between the GPU and the CPU, and prefill streaming experts through staging slots. A worker
// that dies fails the forward with its name in the error, without a hang. Without MPS the worker
// still runs (MOE_GPU_WORKER_WITHOUT_MPS, time-sliced, only slower). Skips without a device.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/gpu/qwen3moe_gpu.h"
#include "coordinator/model/generation.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/gpu/gpu_golden_util.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using namespace moe::model;
using moe::gpu::GpuOptions;
using moe::gpu::Qwen3MoeGpu;
using namespace moe::test::gpu;

fs::path first_model() {
  for (const char* q : {"Q4_K_M", "Q8_0", "F16", "Q6_K", "Q4_0", "Q2_0"}) {
    const fs::path p =
        moe::test::testdata_dir() / "models" / (std::string("tiny-qwen3moe-sv-") + q + ".gguf");
    if (fs::exists(p)) return p;
  }
  throw std::runtime_error("no tiny-qwen3moe-sv model in " + moe::test::testdata_dir().string());
}

// The worker is the moe-gpu-worker beside this test's executable (the executor's default).
GpuOptions in_worker(GpuOptions o) {
  ::setenv("MOE_GPU_WORKER_WITHOUT_MPS", "1", 1);
  o.gpu_executor = "process";
  return o;
}

// The worker's pid from describe() ("... moe-gpu-worker (pid N, ...").
pid_t worker_pid(const Qwen3MoeGpu& m) {
  const std::string d = m.describe();
  const size_t at = d.find("moe-gpu-worker (pid ");
  if (at == std::string::npos) return -1;
  return static_cast<pid_t>(std::atoi(d.c_str() + at + std::strlen("moe-gpu-worker (pid ")));
}

// A 40-token prefill (streamed when the options stream), 12 decode steps, logits of every step.
GenerateResult run(Qwen3MoeGpu& m) {
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 40; ++i) prompt.push_back(100 + 7 * i);
  GenerateOptions opt;
  opt.n_steps = 12;
  opt.keep_logits = true;
  KvCache c = m.make_cache(256, KvType::F16, KvType::F16);
  return generate(m, c, prompt, opt);
}

TEST(GpuWorkerProcess, MatchesInProcessBitForBit) {
  REQUIRE_GPU();
  const auto file = moe::gguf::GgufFile::open(first_model().string(), moe::gguf::LoadMode::Loaded);
  moe::cpu::ThreadPool pool(2);
  struct Case {
    const char* name;
    GpuOptions opt;
  };
  std::vector<Case> cases = {{"all experts in VRAM", options(kPlacements[0])},
                             {"-ncmoe 2, 1 MiB pool", options(kPlacements[2])}};
  GpuOptions streamed = options(kPlacements[1]);  // -cmoe: prefill streams through 4 slots
  streamed.moe_staging_slots = 4;
  streamed.moe_stream_share = 0.5;        // and decode copies half its misses
  streamed.moe_prefill_cpu_share = 0.25;  // a fixed share: auto's choice follows timings
  cases.push_back({"-cmoe, streamed prefill and misses", streamed});
  for (const Case& c : cases) {
    Qwen3MoeGpu local(file, pool, nullptr, c.opt);
    Qwen3MoeGpu remote(file, pool, nullptr, in_worker(c.opt));
    ASSERT_GT(worker_pid(remote), 0) << remote.describe();
    const GenerateResult a = run(local), b = run(remote);
    EXPECT_EQ(a.tokens, b.tokens) << c.name;
    ASSERT_EQ(a.logits.size(), b.logits.size());
    ASSERT_FALSE(a.logits.empty());
    EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)))
        << c.name << ": the worker's logits differ from the coordinator's";
    std::printf("%s: %zu tokens, worker == in-process bit for bit\n", c.name, b.tokens.size());
  }
}

TEST(GpuWorkerProcess, DeadWorkerFailsTheForwardClearly) {
  REQUIRE_GPU();
  const auto file = moe::gguf::GgufFile::open(first_model().string());
  moe::cpu::ThreadPool pool(2);
  for (const int placement : {0, 2}) {  // decode routed on the device; split layers
    Qwen3MoeGpu m(file, pool, nullptr, in_worker(options(kPlacements[placement])));
    const pid_t pid = worker_pid(m);
    ASSERT_GT(pid, 0) << m.describe();
    (void)run(m);  // works while the worker lives
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    try {
      for (int i = 0; i < 3; ++i) (void)run(m);
      FAIL() << "forwards kept working after the worker was killed";
    } catch (const moe::Error& e) {
      EXPECT_NE(std::string(e.what()).find("moe-gpu-worker"), std::string::npos) << e.what();
      std::printf("%s, worker killed: %s\n", kPlacements[placement].name, e.what());
    }
  }
}

TEST(GpuWorkerProcess, FallsBackInProcessSayingWhy) {
  REQUIRE_GPU();
  const auto file = moe::gguf::GgufFile::open(first_model().string());
  moe::cpu::ThreadPool pool(2);
  GpuOptions o = in_worker(options(kPlacements[0]));
  ::setenv("MOE_GPU_WORKER", "/nonexistent/moe-gpu-worker", 1);
  Qwen3MoeGpu m(file, pool, nullptr, o);
  ::unsetenv("MOE_GPU_WORKER");
  const std::string d = m.describe();
  EXPECT_NE(d.find("in the coordinator's process (--gpu-executor process: cannot start"),
            std::string::npos)
      << d;
  ::unsetenv("MOE_GPU_WORKER_WITHOUT_MPS");
  ::setenv("MOE_MPS_UNAVAILABLE", "nvidia-cuda-mps-control not found", 1);
  Qwen3MoeGpu n(file, pool, nullptr, o);
  EXPECT_NE(n.describe().find("MPS unavailable: nvidia-cuda-mps-control not found"),
            std::string::npos)
      << n.describe();
  ::unsetenv("MOE_MPS_UNAVAILABLE");
  EXPECT_FALSE(run(n).tokens.empty());
}

}  // namespace
