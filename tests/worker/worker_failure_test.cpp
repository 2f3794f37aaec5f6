// Failure paths of the out-of-process expert path: the worker killed mid-run, a worker that cannot
// start or exits at start, a segment with a bad header, and the coordinator dying without any
// clean-up. Nothing may hang, and no process or segment may be left behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>
#include <vector>

#include "common/shm/shm_segment.h"
#include "experts/expert_protocol.h"
#include "tests/worker/worker_test_util.h"

namespace {

using namespace moe::model;
using moe::GgmlType;
using moe::test::error_of;
using moe::test::our_segments;
using moe::test::worker_options;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

bool no_children_left() { return ::waitpid(-1, nullptr, WNOHANG) == -1 && errno == ECHILD; }

TEST(WorkerFailure, KilledMidRunThrowsPromptly) {
  const std::string path = moe::test::synth_model(GgmlType::F32);
  {
    RemoteExpertExecutor ex(worker_options(path));
    const pid_t worker = ex.worker_pid();
    std::vector<float> x(64, 0.5f), out(64);
    const std::vector<ExpertItem> items = {{0, 1, 0.5f}, {0, 3, 0.5f}};
    // Stopped, the worker cannot answer: the request is surely in flight when it dies.
    ASSERT_EQ(::kill(worker, SIGSTOP), 0);
    auto call = std::async(std::launch::async, [&] {
      return error_of([&] { ex.run(0, x.data(), 1, items, out.data()); });
    });
    ASSERT_EQ(call.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
    const auto killed = Clock::now();
    ASSERT_EQ(::kill(worker, SIGKILL), 0);
    ASSERT_EQ(call.wait_for(std::chrono::seconds(2)), std::future_status::ready);
    EXPECT_LT(Clock::now() - killed, std::chrono::seconds(2));
    const std::string err = call.get();
    EXPECT_NE(err.find("CPU worker (pid " + std::to_string(worker) + ") died"), std::string::npos)
        << err;
    EXPECT_NE(err.find("signal 9"), std::string::npos) << err;
    // Every later call fails the same way, at once.
    EXPECT_NE(error_of([&] { ex.run(0, x.data(), 1, items, out.data()); }).find("died"),
              std::string::npos);
  }
  EXPECT_TRUE(our_segments().empty());
  EXPECT_TRUE(no_children_left());
}

TEST(WorkerFailure, KilledBetweenRunsThrows) {
  const std::string path = moe::test::synth_model(GgmlType::F32);
  {
    RemoteExpertExecutor ex(worker_options(path));
    std::vector<float> x(64, 0.5f), out(64);
    const std::vector<ExpertItem> items = {{0, 2, 1.0f}};
    ex.run(1, x.data(), 1, items, out.data());
    ASSERT_EQ(::kill(ex.worker_pid(), SIGKILL), 0);
    const std::string err = error_of([&] { ex.run(1, x.data(), 1, items, out.data()); });
    EXPECT_NE(err.find("died"), std::string::npos) << err;
  }
  EXPECT_TRUE(our_segments().empty());
  EXPECT_TRUE(no_children_left());
}

TEST(WorkerFailure, MissingBinary) {
  RemoteExpertOptions opt = worker_options(moe::test::synth_model(GgmlType::F32));
  opt.worker_bin = "/nonexistent/moe-cpu-worker";
  const std::string err = error_of([&] { RemoteExpertExecutor ex(opt); });
  EXPECT_NE(err.find("cannot start '/nonexistent/moe-cpu-worker'"), std::string::npos) << err;
  EXPECT_NE(err.find("No such file"), std::string::npos) << err;
  EXPECT_TRUE(our_segments().empty());
  EXPECT_TRUE(no_children_left());
}

TEST(WorkerFailure, WorkerExitsAtStart) {
  RemoteExpertOptions opt = worker_options(moe::test::synth_model(GgmlType::F32));
  opt.model_path = "/nonexistent/model.gguf";
  const std::string err = error_of([&] { RemoteExpertExecutor ex(opt); });
  EXPECT_NE(err.find("exited with status 1 before it was ready"), std::string::npos) << err;
  EXPECT_TRUE(our_segments().empty());
  EXPECT_TRUE(no_children_left());
}

TEST(WorkerFailure, WorkerNeverReadyTimesOut) {
  const fs::path script =
      fs::temp_directory_path() / ("moe_worker_test_sleeper_" + std::to_string(::getpid()) + ".sh");
  std::ofstream(script) << "#!/bin/sh\nexec sleep 30\n";
  fs::permissions(script, fs::perms::owner_all);
  RemoteExpertOptions opt = worker_options(moe::test::synth_model(GgmlType::F32));
  opt.worker_bin = script.string();
  opt.start_timeout = std::chrono::milliseconds(300);
  const std::string err = error_of([&] { RemoteExpertExecutor ex(opt); });
  EXPECT_NE(err.find("was not ready after 300 ms"), std::string::npos) << err;
  EXPECT_TRUE(our_segments().empty());
  EXPECT_TRUE(no_children_left());
  fs::remove(script);
}

struct Proc {
  int rc = -1;
  std::string out;
};

// Runs the worker on `segment` (stderr captured); `timeout` guards against a hang.
Proc run_worker(const std::string& segment) {
  const std::string cmd = "timeout 20 " + moe::test::kWorkerBin + " --model " +
                          moe::test::synth_model(GgmlType::F32) + " --segment " + segment +
                          " --coordinator-pid " + std::to_string(::getpid()) + " 2>&1";
  Proc p;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return p;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) p.out.append(buf, n);
  const int st = ::pclose(f);
  p.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return p;
}

TEST(WorkerFailure, BadSegmentHeaderExitsWithMessage) {
  using namespace moe::shm;
  const ExpertDims dims{64, 8, 16};
  const size_t bytes = expert_segment_layout(dims).total;
  struct Case {
    const char* what;
    void (*corrupt)(ExpertSegmentHeader&);
    const char* message;
  };
  const Case cases[] = {
      {"zeroed", [](ExpertSegmentHeader& h) { h.magic.store(0); }, "bad magic"},
      {"version", [](ExpertSegmentHeader& h) { h.version = 99; }, "version 99"},
      {"n_embd", [](ExpertSegmentHeader& h) { h.n_embd = 32; }, "bytes, its sizes need"},
      {"max_tokens", [](ExpertSegmentHeader& h) { h.max_tokens = int64_t{1} << 40; }, "max_tokens"},
      {"total", [](ExpertSegmentHeader& h) { h.total_bytes += 64; }, "header says"},
      {"taken", [](ExpertSegmentHeader& h) { h.worker_ready.store(1); }, "already attached"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ShmSegment seg = ShmSegment::create(run_segment_name("bad-header"), bytes);
    ExpertSegment v = format_expert_segment(seg.data(), seg.size(), dims);
    c.corrupt(*v.header);
    const Proc p = run_worker(seg.name());
    EXPECT_EQ(p.rc, 1) << p.out;
    EXPECT_NE(p.out.find("moe-cpu-worker: error: expert segment"), std::string::npos) << p.out;
    EXPECT_NE(p.out.find(c.message), std::string::npos) << p.out;
  }
  // A model of another width: n_embd consistent with the layout but not the model's.
  {
    ShmSegment seg = ShmSegment::create(run_segment_name("bad-header"),
                                        expert_segment_layout({32, 8, 16}).total);
    format_expert_segment(seg.data(), seg.size(), {32, 8, 16});
    const Proc p = run_worker(seg.name());
    EXPECT_EQ(p.rc, 1) << p.out;
    EXPECT_NE(p.out.find("n_embd 32, the model has 64"), std::string::npos) << p.out;
  }
  const Proc missing = run_worker("/moe-no-such-segment");
  EXPECT_EQ(missing.rc, 1) << missing.out;
  EXPECT_NE(missing.out.find("/moe-no-such-segment"), std::string::npos) << missing.out;
}

// The coordinator is a forked child that starts the worker and _exit()s without cleaning up. The
// orphaned worker becomes our child (subreaper), so we can see when and how it exits.
TEST(WorkerFailure, WorkerExitsWhenCoordinatorDies) {
  const std::string path = moe::test::synth_model(GgmlType::F32);
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t coordinator = ::fork();
  ASSERT_GE(coordinator, 0);
  if (coordinator == 0) {
    ::close(fds[0]);
    pid_t worker = -1;
    try {
      auto* ex = new RemoteExpertExecutor(worker_options(path));  // leaked on purpose
      worker = ex->worker_pid();
    } catch (...) {
    }
    (void)!::write(fds[1], &worker, sizeof worker);
    ::_exit(0);  // no destructors: the worker and the segment stay behind
  }
  ::close(fds[1]);
  pid_t worker = -1;
  ASSERT_EQ(::read(fds[0], &worker, sizeof worker), static_cast<ssize_t>(sizeof worker));
  ::close(fds[0]);
  const auto died = Clock::now();
  ASSERT_GT(worker, 0);
  const std::string segment = "/dev/shm/moe-" + std::to_string(coordinator) + "-experts-0";
  ASSERT_EQ(::waitpid(coordinator, nullptr, 0), coordinator);  // reaped: its pid is gone

  int status = 0;
  pid_t r = 0;
  while ((r = ::waitpid(worker, &status, WNOHANG)) == 0 &&
         Clock::now() - died < std::chrono::seconds(2)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (r == 0) {  // clean up before failing
    ::kill(worker, SIGKILL);
    ::waitpid(worker, nullptr, 0);
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  ASSERT_EQ(r, worker) << "the worker outlived its coordinator by 2 s";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  // The worker unlinks the segment its dead coordinator could not (or another test process's
  // stale clean-up did first): either way nothing is left.
  EXPECT_FALSE(fs::exists(segment));
}

}  // namespace
