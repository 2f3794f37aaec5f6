// moe-bench-ring run as a process with a tiny --iters: its text and JSON output parse and it
// rejects bad options. The numbers themselves are not checked.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct Result {
  int rc = -1;
  std::string out;
};

Result run_bench(const std::string& args) {
  const std::string cmd = std::string(MOE_BIN_DIR) + "/moe-bench-ring " + args + " 2>&1";
  Result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return r;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A CPU this process may run on (containers may not allow CPU 0).
int allowed_cpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) return c;
  }
  return 0;
}

TEST(MoeBenchRing, JsonOutputParses) {
  const std::string cpu = std::to_string(allowed_cpu());
  const Result r = run_bench("--iters 200 --spin 100 --json --pin " + cpu + "," + cpu);
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("iters"), 200);
  EXPECT_EQ(j.at("message_bytes"), 64);
  EXPECT_EQ(j.at("spin"), 100);
  EXPECT_EQ(j.at("pin").size(), 2u);
  for (const char* k : {"median", "p90", "p99", "max"}) {
    EXPECT_TRUE(j.at("handoff_us").at(k).is_number()) << k;
  }
}

TEST(MoeBenchRing, TextOutput) {
  const Result r = run_bench("--iters 50");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("50 round trips of 64-byte messages"), std::string::npos) << r.out;
  for (const char* k : {"median ", "p90 ", "p99 ", "max "}) {
    EXPECT_NE(r.out.find(k), std::string::npos) << k << "\n" << r.out;
  }
}

TEST(MoeBenchRing, UsageErrors) {
  EXPECT_EQ(run_bench("--iters 0").rc, 2);
  EXPECT_EQ(run_bench("--pin 0").rc, 2);
  EXPECT_EQ(run_bench("--bogus").rc, 2);
}

}  // namespace
