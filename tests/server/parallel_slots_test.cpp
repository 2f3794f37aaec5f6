// -np N through the whole server: a request that arrives while another decodes starts at the next
// step and finishes first (with -np 1 it waits for the other to end: the same check run that way
// shows it can fail), /slots shows the slots, and each conversation keeps its own slot's prompt
// cache while another runs beside it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/coordinator_harness.h"
#include "tests/server/http_client.h"
#include "tests/testdata.h"

namespace moe::test {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

struct Overlap {
  StreamResult long_run, short_run;
  SteadyClock::time_point long_half, long_end, short_first, short_end;
  json slots_while_running;
};

// A long generation starts; once its first token is out, a short one is sent. Returns when both
// have ended, with the times they produced tokens.
Overlap long_then_short(int n_parallel) {
  Coordinator c((testdata_dir() / "models/tiny-qwen3moe-sv-Q8_0.gguf").string(),
                {"-np", std::to_string(n_parallel), "-c", "4096", "--http-port", "0"});
  const std::string base = "http://" + c.http_addr();
  const std::vector<int32_t> p1 = tokenize(c, "A long story about the sea, the wind and a boat.");
  const std::vector<int32_t> p2 = tokenize(c, "Two words.");
  Overlap o;
  std::mutex mu;
  std::condition_variable cv;
  bool started = false;
  std::thread long_thread([&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(in(std::chrono::seconds(120)));
    o.long_run = run_stream(*c.gen, greedy(p1, 800), ctx, [&](const StreamResult& r) {
      if (r.tokens.size() >= 400 && o.long_half == SteadyClock::time_point{}) {
        o.long_half = SteadyClock::now();
      }
      if (r.chunks == 1) {
        // Both slots exist, and this request is in one of them.
        o.slots_while_running = json::parse(curl("GET", base + "/slots").body);
        std::lock_guard lock(mu);
        started = true;
        cv.notify_all();
      }
    });
    o.long_end = SteadyClock::now();
  });
  {
    std::unique_lock lock(mu);
    cv.wait_for(lock, std::chrono::seconds(60), [&] { return started; });
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(120)));
  o.short_run = run_stream(*c.gen, greedy(p2, 8), ctx, [&](const StreamResult& r) {
    if (r.chunks == 1) o.short_first = SteadyClock::now();
  });
  o.short_end = SteadyClock::now();
  long_thread.join();
  EXPECT_TRUE(c.stop());
  return o;
}

TEST(ParallelSlots, ASecondRequestRunsBesideTheFirst) {
  const Overlap o = long_then_short(2);
  ASSERT_TRUE(o.long_run.status.ok()) << o.long_run.status.error_message();
  ASSERT_TRUE(o.short_run.status.ok()) << o.short_run.status.error_message();
  EXPECT_EQ(o.long_run.tokens.size(), 800u);
  EXPECT_EQ(o.short_run.tokens.size(), 8u);
  // Both produced tokens before either finished: the short one began and ended while the long
  // one was still decoding.
  EXPECT_LT(o.short_first, o.long_end);
  EXPECT_LT(o.short_end, o.long_end);
  ASSERT_EQ(o.slots_while_running.size(), 2u) << o.slots_while_running.dump();
  int processing = 0;
  for (const json& s : o.slots_while_running) {
    EXPECT_EQ(s["n_ctx"], 2048);  // -c shared among the slots, as llama-server
    processing += s["is_processing"].get<bool>() ? 1 : 0;
  }
  EXPECT_GE(processing, 1);
}

// The same with one slot: the second request waits for the first to end.
TEST(ParallelSlots, OneSlotRunsRequestsOneAfterTheOther) {
  const Overlap o = long_then_short(1);
  ASSERT_TRUE(o.long_run.status.ok()) << o.long_run.status.error_message();
  ASSERT_TRUE(o.short_run.status.ok()) << o.short_run.status.error_message();
  // Its first token came after the long one's 400th had reached the client: the server had 400
  // more of the long one's tokens to generate first. (Not after the long one's end as the client
  // sees it: the two streams reach the client on different threads, in either order.)
  EXPECT_GT(o.short_first, o.long_half);
  EXPECT_EQ(o.slots_while_running.size(), 1u);
}

// Two conversations take turns: each next turn finds its own slot's cache (with one slot the
// other conversation would have replaced it).
void conversations_keep_their_slots(const std::string& model) {
  Coordinator c(model, {"-np", "2", "-c", "2048"});
  const std::vector<int32_t> x = tokenize(c, "The first conversation is about apples and pears.");
  const std::vector<int32_t> y =
      tokenize(c, "A second one, about trains, stations and timetables.");
  const std::vector<int32_t> more = tokenize(c, " Tell me more.");
  StreamResult rx = run_stream(*c.gen, greedy(x, 4));
  StreamResult ry = run_stream(*c.gen, greedy(y, 4));
  ASSERT_TRUE(rx.status.ok() && ry.status.ok());
  for (auto [prompt, first] : {std::pair{x, rx}, std::pair{y, ry}}) {
    std::vector<int32_t> next = prompt;
    next.insert(next.end(), first.tokens.begin(), first.tokens.end());
    next.insert(next.end(), more.begin(), more.end());
    const StreamResult turn = run_stream(*c.gen, greedy(next, 3));
    ASSERT_TRUE(turn.status.ok()) << turn.status.error_message();
    // All but the last generated token, which was sampled and never evaluated.
    EXPECT_EQ(turn.finish.cached_tokens(), static_cast<int32_t>(prompt.size() + 3));
  }
  EXPECT_TRUE(c.stop());
}

TEST(ParallelSlots, EachConversationKeepsItsSlot) {
  conversations_keep_their_slots((testdata_dir() / "models/tiny-qwen3moe-sv-Q8_0.gguf").string());
}

TEST(ParallelSlots, EachConversationKeepsItsSlotHybrid) {
  conversations_keep_their_slots(
      (qwen35moe_testdata_dir() / "models/tiny-qwen35moe-sv-Q8_0.gguf").string());
}

}  // namespace
}  // namespace moe::test
