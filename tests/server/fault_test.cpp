// Faults and flow control through the real processes: cancellation (client and deadline), a full
// queue, kill -9 of a CPU worker mid-generation (UNAVAILABLE within 2 s, then an automatic
// restart), death of the coordinator (workers gone within 2 s), Shutdown over gRPC. Each case
// checks that no process or shared-memory segment is left behind.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/coordinator_harness.h"
#include "tests/testdata.h"

namespace moe::test {
namespace {

using Ms = std::chrono::milliseconds;

std::string model_path() { return (testdata_dir() / "models/tiny-qwen3moe-sv-Q4_0.gguf").string(); }

pid_t worker_pid(Coordinator& c) {
  const v1::GetPlacementResponse p = c.placement();
  if (p.workers_size() < 1) throw std::runtime_error("no workers");
  return p.workers(0).pid();
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

// What /proc lists as the children of `pid`, over all its threads (a child belongs to the thread
// that started it).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream f(t.path() / "children");
    for (pid_t c; f >> c;) out.push_back(c);
  }
  return out;
}

// NAME=value entries of a process's environment as it started.
std::vector<std::string> environment_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::vector<std::string> out;
  for (std::string e; std::getline(f, e, '\0');) out.push_back(e);
  return out;
}

std::filesystem::path fresh_dir(const std::string& tag) {
  const auto d =
      std::filesystem::temp_directory_path() / ("moe_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The processes of one run, watched from before a fault (so a recycled pid cannot pass for one
// of them). Whatever still runs at the end is stopped (TERM, then KILL), so that a failing case
// leaves nothing to the next.
class Watched {
 public:
  void add(pid_t pid, const std::string& what) {
    watches_.emplace_back(pid);
    names_.push_back(what + " " + std::to_string(pid));
  }
  // Empty when all are gone within `limit`; otherwise the ones still running.
  std::string alive_after(Ms limit) const {
    const auto end = std::chrono::steady_clock::now() + limit;
    for (;;) {
      std::string alive;
      for (size_t i = 0; i < watches_.size(); ++i) {
        if (watches_[i].alive()) alive += names_[i] + " ";
      }
      if (alive.empty() || std::chrono::steady_clock::now() >= end) return alive;
      std::this_thread::sleep_for(Ms(10));
    }
  }
  ~Watched() {
    for (const worker::ProcessWatch& w : watches_) {
      if (w.alive()) ::kill(w.pid(), SIGTERM);
    }
    alive_after(Ms(3000));
    for (const worker::ProcessWatch& w : watches_) {
      if (w.alive()) ::kill(w.pid(), SIGKILL);
    }
  }

 private:
  std::vector<worker::ProcessWatch> watches_;
  std::vector<std::string> names_;
};

// A SIGKILL of scripts/moe-coordinator runs none of its traps. The coordinator, which the script
// asks to exit with it (MOE_EXIT_WITH_PARENT), and through it the workers are gone within 2 s.
TEST(LaunchScript, KilledScriptLeavesNoCoordinatorOrWorkers) {
  ::setenv("MOE_BIN_DIR", kBinDir.c_str(), 1);
  const auto dir = fresh_dir("script_kill");
  const std::string ready = (dir / "ready").string();
  auto sh = model::ChildProcess::spawn({std::string(MOE_SOURCE_DIR) + "/scripts/moe-coordinator",
                                        "-m", model_path(), "--port", "0", "--http-port", "0", "-c",
                                        "256", "--ready-file", ready});
  ASSERT_TRUE(
      wait_until([&] { return std::filesystem::exists(ready) || !sh.running(); }, Ms(60000)));
  ASSERT_TRUE(sh.running()) << sh.describe();
  const std::vector<pid_t> coord = children_of(sh.pid());
  ASSERT_EQ(coord.size(), 1u);
  const std::vector<pid_t> workers = children_of(coord[0]);
  ASSERT_FALSE(workers.empty());
  Watched run;
  run.add(coord[0], "moe-coordinator");
  for (pid_t w : workers) run.add(w, "moe-cpu-worker");

  sh.kill();
  EXPECT_EQ(run.alive_after(Ms(2000)), "");
  // It stopped as on SIGTERM: segments and its ready file removed.
  EXPECT_TRUE(wait_until([&] { return segments_of(coord[0]).empty(); }, Ms(1000)));
  EXPECT_FALSE(std::filesystem::exists(ready));
  std::filesystem::remove_all(dir);
}

// The same through scripts/with-mps, which scripts/moe-coordinator puts between itself and the
// coordinator for --gpu-executor process. That needs a GPU, so a shell stands in for the script
// (it sets MOE_EXIT_WITH_PARENT and runs with-mps as a child) and a fake daemon for NVIDIA's MPS.
// with-mps passes the request on, and stops its daemon once the coordinator is gone.
TEST(LaunchScript, KilledParentOfWithMpsLeavesNothing) {
  const auto dir = fresh_dir("with_mps_kill");
  const std::string ready = (dir / "ready").string();
  std::filesystem::create_directories(dir / "bin");
  std::filesystem::create_symlink(
      std::string(MOE_SOURCE_DIR) + "/tests/server/fake-nvidia-cuda-mps-control",
      dir / "bin/nvidia-cuda-mps-control");
  auto parent = model::ChildProcess::spawn(
      {"/bin/bash", "-c", R"(export MOE_EXIT_WITH_PARENT=$$ PATH="$0:$PATH"; "$@" & wait)",
       (dir / "bin").string(), std::string(MOE_SOURCE_DIR) + "/scripts/with-mps",
       kBinDir + "/moe-coordinator", "-m", model_path(), "--port", "0", "-c", "256", "--ready-file",
       ready});
  ASSERT_TRUE(
      wait_until([&] { return std::filesystem::exists(ready) || !parent.running(); }, Ms(60000)));
  ASSERT_TRUE(parent.running()) << parent.describe();
  const std::vector<pid_t> with_mps = children_of(parent.pid());
  ASSERT_EQ(with_mps.size(), 1u);
  const std::vector<pid_t> coord = children_of(with_mps[0]);
  ASSERT_EQ(coord.size(), 1u);
  const std::vector<pid_t> workers = children_of(coord[0]);
  ASSERT_FALSE(workers.empty());
  // The coordinator runs under the (fake) daemon.
  std::string pipe_dir;
  bool mps_active = false;
  for (const std::string& e : environment_of(coord[0])) {
    if (e.rfind("CUDA_MPS_PIPE_DIRECTORY=", 0) == 0) pipe_dir = e.substr(e.find('=') + 1);
    if (e == "MOE_MPS_ACTIVE=1") mps_active = true;
  }
  ASSERT_TRUE(mps_active);
  ASSERT_FALSE(pipe_dir.empty());
  const pid_t daemon = std::atoi(read_file(pipe_dir + "/nvidia-cuda-mps-control.pid").c_str());
  ASSERT_GT(daemon, 0);
  Watched run, mps;
  run.add(coord[0], "moe-coordinator");
  for (pid_t w : workers) run.add(w, "moe-cpu-worker");
  mps.add(with_mps[0], "with-mps");
  mps.add(daemon, "MPS daemon");

  parent.kill();
  EXPECT_EQ(run.alive_after(Ms(2000)), "");
  // Then with-mps tells the daemon to quit (it polls it every 0.1 s) and removes its directories.
  EXPECT_EQ(mps.alive_after(Ms(3000)), "");
  EXPECT_TRUE(wait_until([&] { return !std::filesystem::exists(pipe_dir); }, Ms(1000)));
  EXPECT_TRUE(wait_until([&] { return segments_of(coord[0]).empty(); }, Ms(1000)));
  EXPECT_FALSE(std::filesystem::exists(ready));
  std::filesystem::remove_all(dir);
}

// --ready-file names a file for the coordinator to create. One that is already there (another
// program's, or one left by a run killed with SIGKILL) is refused before anything starts, with
// a message naming it, and left as it was.
TEST(ReadyFile, AnExistingFileIsRefusedAndLeftAlone) {
  const auto dir = fresh_dir("ready_exists");
  const std::string ready = (dir / "ready").string(), log = (dir / "log").string();
  std::ofstream(ready) << "precious\n";
  auto p = model::ChildProcess::spawn({"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>'" + log + "'",
                                       kBinDir + "/moe-coordinator", "-m", model_path(), "--port",
                                       "0", "-c", "256", "--ready-file", ready});
  ASSERT_TRUE(p.wait_for(std::chrono::seconds(20))) << "it started anyway";
  EXPECT_EQ(p.exit_code(), 1);
  EXPECT_EQ(read_file(ready), "precious\n");
  const std::string err = read_file(log);
  EXPECT_NE(err.find("--ready-file " + ready + " already exists"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

// Its own file appears whole (written aside, then linked into place) and is removed at exit only
// while it is still the file the coordinator wrote: one put in its place meanwhile is someone
// else's.
TEST(ReadyFile, OnlyTheCoordinatorsOwnFileIsRemovedAtExit) {
  const auto dir = fresh_dir("ready_own");
  const std::filesystem::path ready = dir / "ready";
  auto p = model::ChildProcess::spawn({kBinDir + "/moe-coordinator", "-m", model_path(), "--port",
                                       "0", "-c", "256", "--ready-file", ready.string()});
  ASSERT_TRUE(
      wait_until([&] { return std::filesystem::exists(ready) || !p.running(); }, Ms(60000)));
  ASSERT_TRUE(p.running()) << p.describe();
  const std::string text = read_file(ready);
  EXPECT_EQ(text.rfind("127.0.0.1:", 0), 0u) << text;
  EXPECT_EQ(text.back(), '\n') << text;
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    ++entries;
    EXPECT_EQ(e.path(), ready) << "left behind";
  }
  EXPECT_EQ(entries, 1u);

  std::ofstream(dir / "other") << "someone else's\n";
  std::filesystem::rename(dir / "other", ready);
  ::kill(p.pid(), SIGTERM);
  ASSERT_TRUE(p.wait_for(std::chrono::seconds(10)));
  EXPECT_EQ(p.exit_code(), 0);
  EXPECT_EQ(read_file(ready), "someone else's\n");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moe::test
