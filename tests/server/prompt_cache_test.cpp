// The prompt cache through the whole server: a request that continues the previous one (its
// prompt and what it generated, then more) evaluates only the new tokens, and says how many it
// took from the cache (gRPC Finish.cached_tokens, OpenAI usage.prompt_tokens_details, /metrics).
// qwen35moe's recurrent state cannot be rewound: it reuses an exact continuation, or the prefix up
// to the checkpoint taken before the previous prompt's last token.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/server/coordinator_harness.h"
#include "tests/server/http_client.h"
#include "tests/testdata.h"

namespace moe::test {
namespace {

using json = nlohmann::json;

StreamResult generate(Coordinator& c, const std::vector<int32_t>& prompt, int max_tokens,
                      bool cache_prompt = true) {
  v1::GenerateRequest req = greedy(prompt, max_tokens);
  if (!cache_prompt) req.set_cache_prompt(false);
  return run_stream(*c.gen, req);
}

// Runs P, then P + what it generated + more: the second reuses all but the last generated token
// (which was sampled, never evaluated). A prompt that differs from the cached tokens after 5
// reuses 5 tokens where the cache can keep any prefix; a hybrid model (recurrent state) goes back
// to its checkpoint, taken just before the last prompt token, when that lies in the common prefix.
void continuation_is_reused(const std::string& model, bool keeps_any_prefix) {
  Coordinator c(model, {"-c", "1024"});
  const std::vector<int32_t> p = tokenize(c, "The prompt cache keeps what was evaluated before.");
  ASSERT_GT(p.size(), 6u);
  const StreamResult first = generate(c, p, 4);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_EQ(first.tokens.size(), 4u);
  EXPECT_EQ(first.finish.cached_tokens(), 0);

  std::vector<int32_t> next = p;
  next.insert(next.end(), first.tokens.begin(), first.tokens.end());
  const std::vector<int32_t> more = tokenize(c, " And then some more words.");
  next.insert(next.end(), more.begin(), more.end());
  const StreamResult second = generate(c, next, 3);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(second.finish.prompt_tokens(), static_cast<int32_t>(next.size()));
  EXPECT_EQ(second.finish.cached_tokens(), static_cast<int32_t>(p.size() + 3));

  // Asking for no reuse evaluates everything (and the cache then holds this request).
  const StreamResult cold = generate(c, next, 3, /*cache_prompt=*/false);
  ASSERT_TRUE(cold.status.ok());
  EXPECT_EQ(cold.finish.cached_tokens(), 0);

  // Differing after 5 tokens.
  std::vector<int32_t> other(next.begin(), next.begin() + 5);
  other.insert(other.end(), more.begin(), more.end());
  const StreamResult diverged = generate(c, other, 2);
  ASSERT_TRUE(diverged.status.ok());
  EXPECT_EQ(diverged.finish.cached_tokens(), keeps_any_prefix ? 5 : 0);

  // The same prompt again: all but its last token (a hybrid model from its checkpoint).
  const StreamResult again = generate(c, other, 2);
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.finish.cached_tokens(), static_cast<int32_t>(other.size() - 1));

  // A chat's next turn: the previous prompt, then something other than what was generated. The
  // whole previous prompt is reused; a hybrid model resumes at its checkpoint, one token short.
  std::vector<int32_t> turn = other;
  const std::vector<int32_t> reply = tokenize(c, " A reply the model did not write.");
  turn.insert(turn.end(), reply.begin(), reply.end());
  const StreamResult next_turn = generate(c, turn, 2);
  ASSERT_TRUE(next_turn.status.ok());
  EXPECT_EQ(next_turn.finish.cached_tokens(),
            static_cast<int32_t>(other.size() - (keeps_any_prefix ? 0 : 1)));
  EXPECT_TRUE(c.stop());
}

TEST(PromptCache, Qwen3MoeReusesTheLongestCommonPrefix) {
  continuation_is_reused((testdata_dir() / "models/tiny-qwen3moe-sv-Q8_0.gguf").string(), true);
}

TEST(PromptCache, Qwen35MoeReusesAContinuationOrItsCheckpoint) {
  continuation_is_reused((qwen35moe_testdata_dir() / "models/tiny-qwen35moe-sv-Q8_0.gguf").string(),
                         false);
}

// gpt-oss's sliding-window layers keep a ring of the window + one batch (-b 16 here): a request
// that goes back a little truncates in the ring, one that goes back past a long reply resumes at
// the checkpoint taken before the previous prompt's last token, as a hybrid model does.
TEST(PromptCache, GptOssRingsGoBackALittleOrToTheCheckpoint) {
  Coordinator c((gptoss_testdata_dir() / "models/tiny-gptoss-MXFP4.gguf").string(),
                {"-c", "1024", "-b", "16"});
  const std::vector<int32_t> p = tokenize(c, "The prompt cache keeps what was evaluated before.");
  v1::GenerateRequest req = greedy(p, 40);
  req.set_ignore_eos(true);
  const StreamResult first = run_stream(*c.gen, req);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_EQ(first.tokens.size(), 40u);  // 39 evaluated past the prompt: beyond the ring's slack

  // The previous prompt, then a reply other than the generated one.
  std::vector<int32_t> turn = p;
  const std::vector<int32_t> reply = tokenize(c, " A reply the model did not write.");
  turn.insert(turn.end(), reply.begin(), reply.end());
  const StreamResult second = generate(c, turn, 2);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(second.finish.cached_tokens(), static_cast<int32_t>(p.size() - 1));

  // The same prompt again goes back 2 positions in the ring: all but its last token.
  const StreamResult again = generate(c, turn, 2);
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.finish.cached_tokens(), static_cast<int32_t>(turn.size() - 1));
  EXPECT_TRUE(c.stop());
}

double metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

// A chat's second turn over HTTP: the rendered history is a prefix of the new prompt.
TEST(PromptCache, SecondChatTurnEvaluatesOnlyTheNewTokens) {
  Coordinator c((testdata_dir() / "models/tiny-qwen3moe-sv-Q8_0.gguf").string(),
                {"-c", "2048", "--http-port", "0"});
  const std::string base = "http://" + c.http_addr();
  json body = {{"messages",
                {{{"role", "system"}, {"content", "You are a terse assistant."}},
                 {{"role", "user"}, {"content", "Name three rivers of Europe."}}}},
               {"max_tokens", 8},
               {"temperature", 0}};
  const HttpReply r1 = curl("POST", base + "/v1/chat/completions", body.dump());
  ASSERT_EQ(r1.status, 200) << r1.body;
  const json j1 = json::parse(r1.body);
  EXPECT_EQ(j1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  body["messages"].push_back(j1["choices"][0]["message"]);
  body["messages"].push_back({{"role", "user"}, {"content", "And three of Asia?"}});

  const double evaluated_before =
      metric(curl("GET", base + "/metrics").body, "moe_prompt_tokens_total");
  const HttpReply r2 = curl("POST", base + "/v1/chat/completions", body.dump());
  ASSERT_EQ(r2.status, 200) << r2.body;
  const json j2 = json::parse(r2.body);
  const int64_t prompt = j2["usage"]["prompt_tokens"],
                cached = j2["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GT(cached, 10) << r2.body;  // at least the system and first user message
  EXPECT_LT(cached, prompt);
  const std::string m = curl("GET", base + "/metrics").body;
  EXPECT_EQ(metric(m, "moe_prompt_tokens_total") - evaluated_before,
            static_cast<double>(prompt - cached));
  EXPECT_GE(metric(m, "moe_prompt_cached_tokens_total"), static_cast<double>(cached));

  body["cache_prompt"] = false;
  const json j3 = json::parse(curl("POST", base + "/v1/chat/completions", body.dump()).body);
  EXPECT_EQ(j3["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_TRUE(c.stop());
}

}  // namespace
}  // namespace moe::test
