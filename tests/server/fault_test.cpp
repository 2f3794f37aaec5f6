// Faults and flow control through the real processes: cancellation (client and deadline), a full
// queue, kill -9 of a CPU worker mid-generation (UNAVAILABLE within 2 s, then an automatic
// restart), death of the coordinator (workers gone within 2 s), Shutdown over gRPC. Each case
// checks that no process or shared-memory segment is left behind.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/server/coordinator_harness.h"
#include "tests/testdata.h"

namespace moe::test {
namespace {

using Ms = std::chrono::milliseconds;

std::string model_path() { return (testdata_dir() / "models/tiny-qwen3moe-sv-Q4_0.gguf").string(); }

// A generation that runs for seconds: the whole context, end-of-generation ignored.
v1::GenerateRequest long_request() {
  v1::GenerateRequest r;
  r.set_text("Count forever:");
  r.set_ignore_eos(true);
  r.set_seed(1);
  return r;
}

pid_t worker_pid(Coordinator& c) {
  const v1::GetPlacementResponse p = c.placement();
  if (p.workers_size() < 1) throw std::runtime_error("no workers");
  return p.workers(0).pid();
}

bool wait_until(const std::function<bool()>& f, Ms limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!f()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(Ms(5));
  }
  return true;
}

TEST(Faults, ClientCancelStopsTheJobWithinOneToken) {
  Coordinator c(model_path(), {"-c", "4096"});
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(60)));
  const StreamResult r = run_stream(*c.gen, long_request(), ctx, [&](const StreamResult& s) {
    if (s.chunks == 3) ctx.TryCancel();
  });
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  // The engine notices within a token or two and frees the sequence.
  EXPECT_TRUE(wait_until([&] { return c.stats().requests_cancelled() == 1; }, Ms(2000)));
  const v1::GetStatsResponse s = c.stats();
  EXPECT_EQ(s.running(), 0u);
  EXPECT_LT(s.generated_tokens(), 100u);
  // And serves the next request.
  v1::GenerateRequest next;
  next.set_text("again");
  next.set_max_tokens(4);
  EXPECT_TRUE(run_stream(*c.gen, next).status.ok());
  EXPECT_TRUE(c.stop());
  EXPECT_TRUE(segments_of(c.pid()).empty());
}

TEST(Faults, DeadlineEndsTheStreamAndTheJob) {
  Coordinator c(model_path(), {"-c", "4096"});
  const auto t0 = std::chrono::steady_clock::now();
  const StreamResult r = run_stream(*c.gen, long_request(), Ms(300));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, Ms(1500));
  EXPECT_TRUE(wait_until([&] { return c.stats().requests_cancelled() == 1; }, Ms(2000)));
  EXPECT_EQ(c.stats().running(), 0u);
  EXPECT_TRUE(c.stop());
  EXPECT_TRUE(segments_of(c.pid()).empty());
}

TEST(Faults, FullQueueIsResourceExhausted) {
  Coordinator c(model_path(), {"-c", "4096", "--queue-size", "1"});
  grpc::ClientContext running_ctx, queued_ctx;
  running_ctx.set_deadline(in(std::chrono::seconds(60)));
  queued_ctx.set_deadline(in(std::chrono::seconds(60)));
  StreamResult running, queued;
  std::thread t1([&] { running = run_stream(*c.gen, long_request(), running_ctx, [](auto&) {}); });
  ASSERT_TRUE(wait_until([&] { return c.stats().running() == 1; }, Ms(5000)));
  std::thread t2([&] { queued = run_stream(*c.gen, long_request(), queued_ctx, [](auto&) {}); });
  ASSERT_TRUE(wait_until([&] { return c.stats().queue_depth() == 1; }, Ms(5000)));
  const StreamResult third = run_stream(*c.gen, long_request(), Ms(5000));
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(third.status.error_message().find("queue is full"), std::string::npos);
  EXPECT_EQ(c.stats().requests_rejected(), 1u);
  queued_ctx.TryCancel();
  running_ctx.TryCancel();
  t1.join();
  t2.join();
  EXPECT_EQ(queued.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(wait_until([&] { return c.stats().requests_cancelled() == 2; }, Ms(3000)));
  EXPECT_TRUE(c.stop());
  EXPECT_TRUE(segments_of(c.pid()).empty());
}

TEST(Faults, KilledWorkerIsUnavailableWithinTwoSecondsThenRestarted) {
  Coordinator c(model_path(), {"-c", "4096"});
  const pid_t victim = worker_pid(c);
  ASSERT_GT(victim, 0);
  std::chrono::steady_clock::time_point killed;
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(60)));
  const StreamResult r = run_stream(*c.gen, long_request(), ctx, [&](const StreamResult& s) {
    if (s.chunks == 5) {
      killed = std::chrono::steady_clock::now();
      ::kill(victim, SIGKILL);
    }
  });
  const auto ended = std::chrono::steady_clock::now();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("cpu-0"), std::string::npos) << r.status.error_message();
  EXPECT_LT(ended - killed, Ms(2000));
  EXPECT_TRUE(gone_within(victim, Ms(2000)));

  // The next request starts a new worker under the same name and succeeds.
  v1::GenerateRequest next;
  next.set_text("after the crash");
  next.set_max_tokens(4);
  const StreamResult again = run_stream(*c.gen, next);
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  const pid_t replacement = worker_pid(c);
  EXPECT_NE(replacement, victim);
  const v1::GetStatsResponse s = c.stats();
  ASSERT_EQ(s.workers_size(), 1);
  EXPECT_EQ(s.workers(0).restarts(), 1u);
  EXPECT_EQ(s.workers(0).state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(segments_of(c.pid()).size(), 1u);  // the new worker's only

  EXPECT_TRUE(c.stop());
  EXPECT_TRUE(gone_within(replacement, Ms(2000)));
  EXPECT_TRUE(segments_of(c.pid()).empty());
}

TEST(Faults, WorkersExitWithinTwoSecondsOfTheCoordinatorsDeath) {
  Coordinator c(model_path(), {"-c", "4096"});
  const pid_t worker = worker_pid(c);
  const pid_t coord = c.pid();
  ASSERT_EQ(segments_of(coord).size(), 1u);
  c.process().kill();  // SIGKILL: no destructor runs in the coordinator
  EXPECT_TRUE(gone_within(worker, Ms(2000)));
  // The worker removes the segment its dead creator could not.
  EXPECT_TRUE(wait_until([&] { return segments_of(coord).empty(); }, Ms(1000)));
}

TEST(Faults, ShutdownOverGrpcStopsEverything) {
  Coordinator c(model_path(), {"-c", "256"});
  const pid_t worker = worker_pid(c);
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(10)));
  v1::ShutdownResponse resp;
  EXPECT_TRUE(c.control->Shutdown(&ctx, {}, &resp).ok());
  EXPECT_TRUE(c.process().wait_for(std::chrono::seconds(10)));
  EXPECT_EQ(c.process().exit_code(), 0);
  EXPECT_TRUE(gone_within(worker, Ms(2000)));
  EXPECT_TRUE(segments_of(c.pid()).empty());
}

TEST(Faults, InProcessPlacementServesWithoutWorkers) {
  Coordinator c(model_path(), {"-c", "256", "--placement", "in-process"});
  EXPECT_TRUE(c.placement().in_process());
  EXPECT_EQ(c.placement().workers_size(), 0);
  v1::GenerateRequest req;
  req.set_text("hello");
  req.set_max_tokens(4);
  const StreamResult r = run_stream(*c.gen, req);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_TRUE(segments_of(c.pid()).empty());
  EXPECT_TRUE(c.stop());
}

// scripts/moe-coordinator: signals reach the coordinator, its exit status is the script's, and
// nothing is left running.
TEST(LaunchScript, ForwardsSignalsAndLeavesNothingBehind) {
  ::setenv("MOE_BIN_DIR", kBinDir.c_str(), 1);
  const std::string script = std::string(MOE_SOURCE_DIR) + "/scripts/moe-coordinator";
  const std::string ready =
      (std::filesystem::temp_directory_path() / ("moe_script_ready_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove(ready);
  auto sh = model::ChildProcess::spawn(
      {script, "-m", model_path(), "--port", "0", "-c", "256", "--ready-file", ready});
  ASSERT_TRUE(
      wait_until([&] { return std::filesystem::exists(ready) || !sh.running(); }, Ms(60000)));
  ASSERT_TRUE(sh.running()) << sh.describe();
  // The coordinator is the script's only child.
  std::ifstream children("/proc/" + std::to_string(sh.pid()) + "/task/" + std::to_string(sh.pid()) +
                         "/children");
  pid_t coord = 0;
  children >> coord;
  ASSERT_GT(coord, 0);
  ASSERT_EQ(segments_of(coord).size(), 1u);
  ::kill(sh.pid(), SIGTERM);
  ASSERT_TRUE(sh.wait_for(std::chrono::seconds(10)));
  EXPECT_EQ(sh.exit_code(), 0);
  EXPECT_TRUE(gone_within(coord, Ms(2000)));
  EXPECT_TRUE(segments_of(coord).empty());
  EXPECT_FALSE(std::filesystem::exists(ready));

  // A coordinator that cannot start: its status and message, promptly.
  auto bad = model::ChildProcess::spawn({script, "-m", "/nonexistent.gguf", "--port", "0"});
  ASSERT_TRUE(bad.wait_for(std::chrono::seconds(20)));
  EXPECT_EQ(bad.exit_code(), 1);
}

}  // namespace
}  // namespace moe::test
