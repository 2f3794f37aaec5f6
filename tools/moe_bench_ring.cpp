// moe-bench-ring: cross-process hand-off latency of the shared-memory SPSC ring. A forked child
// echoes every 64-byte message from a "ping" ring back on a "pong" ring; the parent times each
// round trip with steady_clock and reports half of it (one hand-off) as median, p90, p99 and max.
// Exit codes: 0 ok, 1 error (message on stderr), 2 usage.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/shm/shm_segment.h"
#include "common/shm/spsc_ring.h"

namespace {

using namespace moe::shm;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t iters = 200000;
  std::vector<int> pin;  // empty, or {parent CPU, child CPU}
  uint32_t spin = kDefaultSpin;
  bool json = false;
};

struct Message {
  uint64_t seq;
  uint64_t stop;  // nonzero: the child exits
  unsigned char pad[48];
};
static_assert(sizeof(Message) == 64);

constexpr uint32_t kCapacity = 16;  // ping-pong never has more than one message in flight
constexpr auto kCallTimeout = std::chrono::seconds(10);

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0) {
    throw moe::Error("cannot pin to CPU " + std::to_string(cpu) + ": " + std::strerror(errno));
  }
}

struct Rings {
  SpscRing ping, pong;
};

Rings attach_rings(const ShmSegment& seg) {
  const size_t ring_bytes = SpscRing::required_bytes(kCapacity, sizeof(Message));
  auto* base = static_cast<std::byte*>(seg.data());
  return {SpscRing::attach(base, ring_bytes, sizeof(Message)),
          SpscRing::attach(base + ring_bytes, ring_bytes, sizeof(Message))};
}

// The echo side. Opens the segment by name (as a real worker would) so the rings are mapped at a
// different address than in the parent. Never returns: exit status 0 = clean stop.
[[noreturn]] void child_main(const std::string& name, const Args& a, pid_t parent) {
  int rc = 0;
  try {
    if (!a.pin.empty()) pin_to(a.pin[1]);
    ShmSegment seg = ShmSegment::open(name);
    Rings rings = attach_rings(seg);
    RingConsumer in(rings.ping);
    RingProducer out(rings.pong);
    WaitOptions opt{.timeout = kCallTimeout, .spin = a.spin};
    opt.peer_alive = [parent] { return ::getppid() == parent; };
    for (Message m{};;) {
      WaitStatus s = in.pop(&m, sizeof m, opt);
      if (s == WaitStatus::Ok && m.stop) break;
      if (s == WaitStatus::Ok) s = out.push(&m, sizeof m, opt);
      if (s != WaitStatus::Ok) {
        std::fprintf(stderr, "moe-bench-ring: child: %s\n", to_string(s));
        rc = 3;
        break;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-bench-ring: child error: %s\n", e.what());
    rc = 4;
  }
  ::_exit(rc);  // no destructors: the parent owns the segment name
}

double percentile_us(const std::vector<double>& sorted, double p) {
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

int run(const Args& a) {
  const size_t ring_bytes = SpscRing::required_bytes(kCapacity, sizeof(Message));
  ShmSegment seg = ShmSegment::create(run_segment_name("bench-ring"), 2 * ring_bytes);
  auto* base = static_cast<std::byte*>(seg.data());
  SpscRing::format(base, ring_bytes, kCapacity, sizeof(Message));
  SpscRing::format(base + ring_bytes, ring_bytes, kCapacity, sizeof(Message));

  std::fflush(nullptr);  // the child must not flush a copy of our buffers
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) throw moe::Error(std::string("fork failed: ") + std::strerror(errno));
  if (child == 0) child_main(seg.name(), a, parent);

  int child_status = 0;
  bool reaped = false;
  auto child_alive = [&] {
    if (!reaped && ::waitpid(child, &child_status, WNOHANG) == child) reaped = true;
    return !reaped;
  };
  // On an error below, the child is killed and reaped rather than left to notice our exit.
  struct Reaper {
    pid_t pid;
    bool& reaped;
    ~Reaper() {
      if (reaped) return;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reaper{child, reaped};
  if (!a.pin.empty()) pin_to(a.pin[0]);
  Rings rings = attach_rings(seg);
  RingProducer out(rings.ping);
  RingConsumer in(rings.pong);
  WaitOptions opt{.timeout = kCallTimeout, .spin = a.spin};
  opt.peer_alive = child_alive;

  const int64_t warmup = std::min<int64_t>(a.iters, 1000);
  std::vector<double> half_rtt_us(static_cast<size_t>(a.iters));
  Message m{};
  for (int64_t i = -warmup; i < a.iters; ++i) {
    m.seq = static_cast<uint64_t>(i + warmup);
    const auto t0 = Clock::now();
    WaitStatus s = out.push(&m, sizeof m, opt);
    if (s == WaitStatus::Ok) s = in.pop(&m, sizeof m, opt);
    const auto t1 = Clock::now();
    if (s != WaitStatus::Ok) throw moe::Error(std::string("echo child: ") + to_string(s));
    if (m.seq != static_cast<uint64_t>(i + warmup)) throw moe::Error("echo out of order");
    if (i >= 0) {
      half_rtt_us[static_cast<size_t>(i)] =
          std::chrono::duration<double, std::micro>(t1 - t0).count() / 2;
    }
  }
  m.stop = 1;
  if (out.push(&m, sizeof m, opt) != WaitStatus::Ok) throw moe::Error("cannot stop the child");
  if (!reaped && ::waitpid(child, &child_status, 0) != child) {
    throw moe::Error(std::string("waitpid failed: ") + std::strerror(errno));
  }
  reaped = true;
  if (!WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0) {
    throw moe::Error("echo child failed (status " + std::to_string(child_status) + ")");
  }

  std::sort(half_rtt_us.begin(), half_rtt_us.end());
  const double med = percentile_us(half_rtt_us, 0.5), p90 = percentile_us(half_rtt_us, 0.9);
  const double p99 = percentile_us(half_rtt_us, 0.99), max = half_rtt_us.back();
  if (a.json) {
    nlohmann::ordered_json j;
    j["iters"] = a.iters;
    j["message_bytes"] = sizeof(Message);
    j["spin"] = a.spin;
    j["pin"] = a.pin.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(a.pin);
    j["handoff_us"] = {{"median", med}, {"p90", p90}, {"p99", p99}, {"max", max}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::string pinned = "unpinned";
    if (!a.pin.empty()) {
      pinned = "pinned to CPUs " + std::to_string(a.pin[0]) + "," + std::to_string(a.pin[1]);
    }
    std::printf("moe-bench-ring: %lld round trips of %zu-byte messages, spin %u, %s\n",
                static_cast<long long>(a.iters), sizeof(Message), a.spin, pinned.c_str());
    std::printf(
        "hand-off latency (round trip / 2), us: median %.3f  p90 %.3f  p99 %.3f  max %.3f\n", med,
        p90, p99, max);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measure the cross-process hand-off latency of the shared-memory ring"};
  Args a;
  app.add_option("--iters", a.iters, "round trips to time (after up to 1000 warm-up ones)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--pin", a.pin, "CPU0,CPU1: pin the timing process to CPU0, the echo to CPU1")
      ->delimiter(',')
      ->expected(2)
      ->check(CLI::Range(0, CPU_SETSIZE - 1));
  app.add_option("--spin", a.spin, "pause iterations before sleeping on the futex");
  app.add_flag("--json", a.json, "print JSON instead of text");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-bench-ring: error: %s\n", e.what());
    return 1;
  }
}
