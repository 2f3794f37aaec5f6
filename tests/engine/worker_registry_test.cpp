#include "coordinator/engine/worker_registry.h"

#include <gtest/gtest.h>

#include <thread>

namespace moe::engine {
namespace {

Registration reg(const std::string& id, pid_t pid, const std::string& seg) {
  Registration r;
  r.worker_id = id;
  r.pid = pid;
  r.segment = seg;
  r.threads = 2;
  return r;
}

TEST(WorkerRegistry, OnlyTheStartedWorkerMayRegisterAndBeatItsHeart) {
  WorkerRegistry r;
  EXPECT_NE(r.register_worker(reg("cpu-0", 10, "/s")).find("no worker named"), std::string::npos);
  r.expect("cpu-0", "/s");
  EXPECT_NE(r.register_worker(reg("cpu-0", 10, "/other")).find("segment"), std::string::npos);
  EXPECT_EQ(r.register_worker(reg("cpu-0", 10, "/s")), "");
  // Another process claiming the name is refused once the first registered.
  EXPECT_NE(r.register_worker(reg("cpu-0", 11, "/s")).find("pid 10"), std::string::npos);
  EXPECT_TRUE(r.wait_registered("cpu-0", 10, std::chrono::milliseconds(1)));
  EXPECT_TRUE(r.heartbeat("cpu-0", 10, 5, 1.5));
  EXPECT_FALSE(r.heartbeat("cpu-0", 11, 5, 1.5));
  EXPECT_FALSE(r.heartbeat("cpu-9", 10, 5, 1.5));
  const auto snap = r.snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].state, WorkerState::Ready);
  EXPECT_EQ(snap[0].requests_served, 5u);
  EXPECT_TRUE(snap[0].heartbeat_seen);
}

TEST(WorkerRegistry, RestartCountsAndShutdownTellsWorkersToExit) {
  WorkerRegistry r;
  r.expect("cpu-0", "/s");
  ASSERT_EQ(r.register_worker(reg("cpu-0", 10, "/s")), "");
  r.mark_dead("cpu-0");
  EXPECT_FALSE(r.heartbeat("cpu-0", 10, 0, 0));  // a dead worker's late heartbeat: exit
  r.expect("cpu-0", "/s");                       // restarted
  EXPECT_FALSE(r.wait_registered("cpu-0", 12, std::chrono::milliseconds(20)));
  std::thread t([&] { EXPECT_EQ(r.register_worker(reg("cpu-0", 12, "/s")), ""); });
  EXPECT_TRUE(r.wait_registered("cpu-0", 12, std::chrono::seconds(5)));
  t.join();
  EXPECT_EQ(r.snapshot()[0].restarts, 1u);
  EXPECT_TRUE(r.heartbeat("cpu-0", 12, 0, 0));
  r.begin_shutdown();
  EXPECT_FALSE(r.heartbeat("cpu-0", 12, 0, 0));
}

// /metrics exports busy time as a counter: a restarted worker's fresh process starts from zero,
// and what the dead one reported must stay in the total.
TEST(WorkerRegistry, BusyTimeOfEarlierProcessesIsKeptAcrossRestarts) {
  WorkerRegistry r;
  r.expect("cpu-0", "/s");
  ASSERT_EQ(r.register_worker(reg("cpu-0", 10, "/s")), "");
  EXPECT_TRUE(r.heartbeat("cpu-0", 10, 1, 1.5));
  EXPECT_TRUE(r.heartbeat("cpu-0", 10, 2, 2.5));  // each heartbeat: the process's total so far
  r.mark_dead("cpu-0");
  r.expect("cpu-0", "/s");
  EXPECT_EQ(r.snapshot()[0].busy_ms, 0);
  EXPECT_EQ(r.snapshot()[0].busy_ms_before, 2.5);
  ASSERT_EQ(r.register_worker(reg("cpu-0", 12, "/s")), "");
  EXPECT_TRUE(r.heartbeat("cpu-0", 12, 1, 0.5));
  r.mark_dead("cpu-0");
  r.expect("cpu-0", "/s");
  ASSERT_EQ(r.register_worker(reg("cpu-0", 13, "/s")), "");
  EXPECT_TRUE(r.heartbeat("cpu-0", 13, 1, 0.25));
  const WorkerRecord w = r.snapshot()[0];
  EXPECT_EQ(w.restarts, 2u);
  EXPECT_EQ(w.busy_ms, 0.25);
  EXPECT_EQ(w.busy_ms_before + w.busy_ms, 3.25);
}

}  // namespace
}  // namespace moe::engine
