// The OpenAI-compatible HTTP API of a running coordinator, driven by a real HTTP client (curl):
// chat and completions, streamed (SSE) and whole, a tool-call round trip through the chat
// template, every error status (400, 401, 404, 413, 429, 503) with a JSON body, API key on and
// off, /metrics, and the chat page at GET /.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/server/coordinator_harness.h"
#include "tests/server/http_client.h"
#include "tests/testdata.h"

namespace moe::test {
namespace {

using json = nlohmann::json;
using Ms = std::chrono::milliseconds;

std::string model_path() { return (testdata_dir() / "models/tiny-qwen3moe-sv-Q8_0.gguf").string(); }

// The JSON objects of an SSE stream's `data:` lines; `done` tells whether [DONE] ended it.
std::vector<json> sse_events(const std::string& body, bool* done) {
  std::vector<json> out;
  *done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    const std::string line = body.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("data: ", 0) != 0) continue;
    if (line == "data: [DONE]") {
      *done = true;
      continue;
    }
    out.push_back(json::parse(line.substr(6)));
  }
  return out;
}

std::string chat_body(const std::string& user, int max_tokens, bool stream) {
  json b = {{"model", "tiny"},
            {"messages", {{{"role", "user"}, {"content", user}}}},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"stream", stream}};
  if (stream) b["stream_options"] = {{"include_usage", true}};
  return b.dump();
}

class Http : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    coord_ =
        new Coordinator(model_path(), {"-c", "512", "--http-port", "0", "--http-max-body", "4096"});
    base_ = "http://" + coord_->http_addr();
  }
  static void TearDownTestSuite() {
    EXPECT_TRUE(coord_->stop());
    delete coord_;
  }
  static Coordinator* coord_;
  static std::string base_;
};
Coordinator* Http::coord_ = nullptr;
std::string Http::base_;

TEST_F(Http, ChatWholeAndStreamedAgree) {
  ASSERT_FALSE(coord_->http_addr().empty());
  const HttpReply whole =
      curl("POST", base_ + "/v1/chat/completions", chat_body("Hello!", 12, false));
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json j = json::parse(whole.body);
  EXPECT_EQ(j["object"], "chat.completion");
  const json& msg = j["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  const int completion = j["usage"]["completion_tokens"];
  EXPECT_GE(completion, 1);
  EXPECT_LE(completion, 12);
  EXPECT_EQ(j["usage"]["total_tokens"].get<int>(),
            j["usage"]["prompt_tokens"].get<int>() + completion);

  const HttpReply streamed =
      curl("POST", base_ + "/v1/chat/completions", chat_body("Hello!", 12, true));
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  bool done = false;
  const std::vector<json> events = sse_events(streamed.body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string content, reasoning;
  std::string finish;
  for (const json& e : events) {
    if (e.contains("usage") && !e["usage"].is_null()) {
      EXPECT_EQ(e["usage"]["completion_tokens"].get<int>(), completion);
    }
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const json& d = e["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string())
      content += d["content"].get<std::string>();
    if (d.contains("reasoning_content") && d["reasoning_content"].is_string()) {
      reasoning += d["reasoning_content"].get<std::string>();
    }
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  // Greedy: the same text either way.
  EXPECT_EQ(content, msg.value("content", json("")).is_string() ? msg.value("content", "") : "");
  EXPECT_EQ(reasoning, msg.value("reasoning_content", std::string()));
  EXPECT_EQ(finish, j["choices"][0]["finish_reason"]);
}

TEST_F(Http, CompletionsAndModels) {
  const json body = {{"prompt", "The capital of France is"}, {"max_tokens", 6}, {"temperature", 0}};
  const HttpReply r = curl("POST", base_ + "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_TRUE(j["choices"][0]["text"].is_string());
  // The same prompt through gRPC gives the same text.
  v1::GenerateRequest g;
  g.set_text("The capital of France is");
  g.set_max_tokens(6);
  g.mutable_sampling()->set_temperature(0);
  const StreamResult s = run_stream(*coord_->gen, g);
  ASSERT_TRUE(s.status.ok());
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), s.text);

  const HttpReply m = curl("GET", base_ + "/v1/models");
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_EQ(json::parse(m.body)["data"][0]["id"], "tiny-qwen3moe-sv-Q8_0.gguf");
  EXPECT_EQ(curl("GET", base_ + "/health").status, 200);
}

TEST_F(Http, ToolCallRoundTripRendersThroughTheTemplate) {
  const json tools =
      json::array({{{"type", "function"},
                    {"function",
                     {{"name", "get_weather"},
                      {"description", "Weather in a city"},
                      {"parameters",
                       {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
  const json messages = json::array(
      {{{"role", "user"}, {"content", "Weather in Paris?"}},
       {{"role", "assistant"},
        {"content", ""},
        {"tool_calls",
         {{{"id", "call_1"},
           {"type", "function"},
           {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}}}},
       {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny, 21 C"}}});
  const json body = {
      {"messages", messages}, {"tools", tools}, {"max_tokens", 4}, {"temperature", 0}};
  const HttpReply r = curl("POST", base_ + "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const int prompt_tokens = json::parse(r.body)["usage"]["prompt_tokens"];

  // The prompt the server used is the template's rendering of exactly these messages and tools.
  v1::ApplyChatTemplateRequest ar;
  for (const json& m : messages) {
    auto* pm = ar.mutable_chat()->add_messages();
    pm->set_role(m["role"]);
    pm->set_content(m["content"].get<std::string>());
    if (m.contains("tool_call_id")) pm->set_tool_call_id(m["tool_call_id"]);
    if (m.contains("tool_calls")) {
      auto* c = pm->add_tool_calls();
      c->set_id("call_1");
      c->set_name("get_weather");
      c->set_arguments_json("{\"city\":\"Paris\"}");
    }
  }
  ar.mutable_chat()->add_tools_json(tools[0].dump());
  ar.set_tokenize(true);
  v1::ApplyChatTemplateResponse aresp;
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(10)));
  ASSERT_TRUE(coord_->gen->ApplyChatTemplate(&ctx, ar, &aresp).ok());
  EXPECT_EQ(prompt_tokens, aresp.ids_size());
  EXPECT_NE(aresp.text().find("<tool_call>"), std::string::npos);
  EXPECT_NE(aresp.text().find("sunny, 21 C"), std::string::npos);
}

TEST_F(Http, ErrorsAreJsonWithTheRightStatus) {
  expect_error(curl("POST", base_ + "/v1/chat/completions", "{not json"), 400, "not valid JSON");
  expect_error(curl("POST", base_ + "/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"hi","colour":"red"}]})"),
               400, "colour");
  expect_error(curl("POST", base_ + "/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"hi"}],"temperature":-1,"top_p":7})"),
               400, "top_p");
  expect_error(curl("GET", base_ + "/v1/nothing"), 404, "no such route");
  const std::string big = "{\"prompt\":\"" + std::string(8000, 'a') + "\"}";
  expect_error(curl("POST", base_ + "/v1/completions", big), 413, "too large");
}

TEST(HttpAuth, KeyRequiredWhenSetAndOffLoopbackWithout) {
  Coordinator c(model_path(), {"-c", "256", "--http-port", "0", "--api-key", "sesame"});
  const std::string base = "http://" + c.http_addr();
  expect_error(curl("GET", base + "/v1/models"), 401, "missing API key");
  expect_error(curl("GET", base + "/v1/models", "", "-H 'Authorization: Bearer wrong'"), 401,
               "invalid API key");
  EXPECT_EQ(curl("GET", base + "/v1/models", "", "-H 'Authorization: Bearer sesame'").status, 200);
  EXPECT_EQ(curl("GET", base + "/health").status, 200);  // probes need no key
  EXPECT_TRUE(c.stop());

  // Binding beyond loopback without a key is refused at start.
  auto p = model::ChildProcess::spawn({kBinDir + "/moe-coordinator", "-m", model_path(), "--port",
                                       "0", "--http-port", "0", "--http-host", "0.0.0.0"});
  ASSERT_TRUE(p.wait_for(std::chrono::seconds(30)));
  EXPECT_EQ(p.exit_code(), 1);
}

// GET / is the chat page (coordinator/http/webui): HTML with a strict CSP, open without the key;
// its own origin may call the API, another may not; --no-webui turns it off.
TEST(HttpWebui, ChatPageServedOpenAndSameOriginAdmitted) {
  Coordinator c(model_path(), {"-c", "256", "--http-port", "0", "--api-key", "sesame"});
  const std::string base = "http://" + c.http_addr();
  const HttpReply page = curl("GET", base + "/", "", "-i");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("Content-Type: text/html; charset=utf-8"), std::string::npos);
  EXPECT_NE(page.body.find("Content-Security-Policy: default-src 'none'; script-src 'sha256-"),
            std::string::npos);
  EXPECT_NE(page.body.find("connect-src 'self'"), std::string::npos);
  EXPECT_NE(page.body.find("X-Content-Type-Options: nosniff"), std::string::npos);
  EXPECT_NE(page.body.find("<title>moe-runtime chat</title>"), std::string::npos);
  EXPECT_EQ(curl("GET", base + "/index.html").status, 200);
  const std::string key = "-H 'Authorization: Bearer sesame' ";
  EXPECT_EQ(curl("GET", base + "/v1/models", "", key + "-H 'Origin: " + base + "'").status, 200);
  expect_error(curl("GET", base + "/v1/models", "", key + "-H 'Origin: http://evil.example'"), 403,
               "not allowed");
  // DNS rebinding stays refused: a foreign Host with the matching Origin.
  expect_error(curl("GET", base + "/v1/models", "",
                    key + "-H 'Host: evil.example' -H 'Origin: http://evil.example'"),
               403, "not served here");
  EXPECT_TRUE(c.stop());

  Coordinator off(model_path(), {"-c", "256", "--http-port", "0", "--no-webui"});
  expect_error(curl("GET", "http://" + off.http_addr() + "/"), 404, "no such route");
  EXPECT_TRUE(off.stop());
}

TEST(HttpLoad, FullQueueIs429AndDrainingIs503) {
  Coordinator c(model_path(), {"-c", "4096", "--http-port", "0", "--queue-size", "1"});
  const std::string base = "http://" + c.http_addr();
  // Two long streams: one running, one queued; the third is refused.
  const json body = {{"prompt", "Count:"}, {"max_tokens", 3000}, {"stream", true}};
  std::vector<std::thread> streams;
  for (int i = 0; i < 2; ++i) {
    streams.emplace_back(
        [&] { curl("POST", base + "/v1/completions", body.dump(), "--max-time 5"); });
    const unsigned want = static_cast<unsigned>(i) + 1;
    ASSERT_TRUE([&] {
      const auto end = std::chrono::steady_clock::now() + Ms(10000);
      while (std::chrono::steady_clock::now() < end) {
        const auto s = c.stats();
        if (s.running() + s.queue_depth() >= want) return true;
        std::this_thread::sleep_for(Ms(5));
      }
      return false;
    }());
  }
  expect_error(curl("POST", base + "/v1/completions", body.dump()), 429, "queue is full");
  for (auto& t : streams) t.join();  // curl gives up after 5 s; the server cancels both

  // Draining: new requests get 503.
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(30)));
  v1::DrainResponse dr;
  ASSERT_TRUE(c.control->Drain(&ctx, {}, &dr).ok());
  EXPECT_TRUE(dr.drained());
  expect_error(curl("POST", base + "/v1/completions", R"({"prompt":"hi","max_tokens":2})"), 503,
               "draining");
  const std::string metrics = curl("GET", base + "/metrics").body;
  EXPECT_NE(metrics.find("moe_time_to_first_token_seconds_count"), std::string::npos);
  EXPECT_NE(metrics.find("moe_http_requests_total"), std::string::npos);
  EXPECT_NE(metrics.find("code=\"429\""), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("moe_layer_routed_items_total{layer=\"0\"}"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("moe_layer_gpu_hits_total{layer=\"0\"}"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("moe_worker_up{"), std::string::npos) << metrics;
  EXPECT_TRUE(c.stop());
}

// Qwen3.5/3.6: the template ends the prompt inside "<think>\n", so the reply is reasoning until
// the model writes "</think>" (the random tiny model never does in a few tokens). Also runs a
// qwen35moe model through the whole server: coordinator, CPU worker process, HTTP.
TEST(HttpQwen35, ReplyStartsInsideTheReasoningBlock) {
  const std::string model =
      (qwen35moe_testdata_dir() / "models/tiny-qwen35moe-sv-Q8_0.gguf").string();
  Coordinator c(model, {"-c", "512", "--http-port", "0"});
  const std::string base = "http://" + c.http_addr();
  const HttpReply r = curl("POST", base + "/v1/chat/completions", chat_body("Hello!", 8, false));
  ASSERT_EQ(r.status, 200) << r.body;
  const json msg = json::parse(r.body)["choices"][0]["message"];
  const std::string reasoning = msg.value("reasoning_content", std::string());
  EXPECT_FALSE(reasoning.empty()) << r.body;
  EXPECT_TRUE(!msg.contains("content") || msg["content"].is_null() ||
              msg["content"].get<std::string>().empty())
      << r.body;
  EXPECT_TRUE(c.stop());
}

// gpt-oss through the whole server: the harmony template renders the prompt, the tiny MXFP4
// model runs on the CPU, and the harmony parser splits the reply. A grammar spells the reply (the
// random model would write noise), so the channels are known: analysis becomes reasoning_content,
// final the content, a commentary message to functions.NAME a tool call.
TEST(HttpGptOss, HarmonyRepliesSplitIntoReasoningContentAndToolCalls) {
  const std::string model = (gptoss_testdata_dir() / "models/tiny-gptoss-MXFP4.gguf").string();
  Coordinator c(model, {"-c", "1024", "--http-port", "0"});
  const std::string base = "http://" + c.http_addr();
  const auto ask = [&](const std::string& reply) {
    json b = json::parse(chat_body("What is the weather in Paris?", 96, false));
    b["grammar"] = "root ::= \"" + reply + "\"";
    return curl("POST", base + "/v1/chat/completions", b.dump());
  };
  {
    const HttpReply r =
        ask("<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>final"
            "<|message|>It is sunny.");
    ASSERT_EQ(r.status, 200) << r.body;
    const json msg = json::parse(r.body)["choices"][0]["message"];
    EXPECT_EQ(msg.value("reasoning_content", std::string()), "Look it up.") << r.body;
    EXPECT_EQ(msg.value("content", std::string()), "It is sunny.") << r.body;
  }
  {
    const HttpReply r =
        ask("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            "{\\\"city\\\": \\\"Paris\\\"}<|call|>");
    ASSERT_EQ(r.status, 200) << r.body;
    const json choice = json::parse(r.body)["choices"][0];
    ASSERT_TRUE(choice["message"].contains("tool_calls")) << r.body;
    const json call = choice["message"]["tool_calls"][0];
    EXPECT_EQ(call["function"]["name"], "get_weather") << r.body;
    EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
              json::parse(R"({"city": "Paris"})"))
        << r.body;
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.body;
  }
  EXPECT_TRUE(c.stop());
}

}  // namespace
}  // namespace moe::test
