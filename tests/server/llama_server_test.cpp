// llama-server's own routes on a running coordinator (/tokenize, /detokenize, /apply-template,
// /props, /slots) and --alias: round trips against the gRPC API's answers, and the 400s of bad
// bodies.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>
#include <vector>

#include "tests/server/coordinator_harness.h"
#include "tests/server/http_client.h"
#include "tests/testdata.h"

namespace moe::test {
namespace {

using json = nlohmann::json;

std::string model_path() { return (testdata_dir() / "models/tiny-qwen3moe-sv-Q8_0.gguf").string(); }

TEST(LlamaRoutes, TokenizeDetokenizeTemplatePropsSlotsAndAlias) {
  Coordinator c(model_path(),
                {"-c", "512", "--http-port", "0", "--placement", "in-process", "--alias", "hz"});
  const std::string base = "http://" + c.http_addr();

  // /tokenize agrees with gRPC Tokenize, and /detokenize gives the text back.
  const std::string text = "Hello world, <|im_start|>again";
  const HttpReply t = curl("POST", base + "/tokenize", json{{"content", text}}.dump());
  ASSERT_EQ(t.status, 200) << t.body;
  const json ids = json::parse(t.body)["tokens"];
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(10)));
  v1::TokenizeRequest treq;
  treq.set_text(text);
  treq.set_parse_special(true);
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(c.gen->Tokenize(&ctx, treq, &tresp).ok());
  ASSERT_EQ(ids.size(), static_cast<size_t>(tresp.ids_size()));
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], tresp.ids(static_cast<int>(i)));
  const HttpReply d = curl("POST", base + "/detokenize", json{{"tokens", ids}}.dump());
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(json::parse(d.body)["content"], text);
  const json pieces = json::parse(
      curl("POST", base + "/tokenize", json{{"content", "Hi"}, {"with_pieces", true}}.dump())
          .body)["tokens"];
  ASSERT_FALSE(pieces.empty());
  std::string joined;
  for (const json& p : pieces) joined += p["piece"].get<std::string>();
  EXPECT_EQ(joined, "Hi");

  // /apply-template renders what a chat completion would evaluate.
  const HttpReply a =
      curl("POST", base + "/apply-template", R"({"messages":[{"role":"user","content":"Hi"}]})");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(json::parse(a.body)["prompt"],
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

  const json props = json::parse(curl("GET", base + "/props").body);
  EXPECT_EQ(props["default_generation_settings"]["n_ctx"], 512);
  EXPECT_EQ(props["total_slots"], 1);
  EXPECT_EQ(props["model_alias"], "hz");
  // The default cache: f16 everywhere, nothing rotated.
  const std::string default_kv = props["kv_cache"];
  EXPECT_NE(default_kv.find("K f16 V f16"), std::string::npos) << default_kv;
  EXPECT_EQ(default_kv.find("rotated"), std::string::npos) << default_kv;
  EXPECT_NE(props["chat_template"].get<std::string>().find("im_start"), std::string::npos);
  const json slots = json::parse(curl("GET", base + "/slots").body);
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(slots[0]["n_ctx"], 512);
  EXPECT_EQ(slots[0]["is_processing"], false);

  // --alias names the model; another name is 404, the alias or none is served.
  EXPECT_EQ(json::parse(curl("GET", base + "/v1/models").body)["data"][0]["id"], "hz");
  const std::string chat = R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":2)";
  expect_error(curl("POST", base + "/v1/chat/completions", chat + R"(,"model":"gpt-4"})"), 404,
               "not served here");
  const HttpReply ok = curl("POST", base + "/v1/chat/completions", chat + R"(,"model":"hz"})");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(json::parse(ok.body)["model"], "hz");

  // Bad bodies are 400 with the field named.
  expect_error(curl("POST", base + "/tokenize", R"({"content":5})"), 400, "content");
  expect_error(curl("POST", base + "/detokenize", R"({"tokens":[1,-3]})"), 400, "tokens[1]");
  expect_error(curl("POST", base + "/detokenize", R"({"tokens":"no"})"), 400, "tokens");
  expect_error(curl("POST", base + "/apply-template", R"({"messages":"no"})"), 400, "messages");
  expect_error(curl("POST", base + "/tokenize", "[[["), 400, "not valid JSON");
  // Template variables reach the template: one it does not read renders as without, and one
  // that would replace the request's own is refused there.
  const HttpReply effort =
      curl("POST", base + "/apply-template",
           R"({"messages":[{"role":"user","content":"Hi"}],"reasoning_effort":"low"})");
  ASSERT_EQ(effort.status, 200) << effort.body;
  EXPECT_EQ(json::parse(effort.body)["prompt"], json::parse(a.body)["prompt"]);
  expect_error(curl("POST", base + "/apply-template",
                    R"({"messages":[{"role":"user","content":"Hi"}],)"
                    R"("chat_template_kwargs":{"messages":[]}})"),
               400, "set by the request already");
  EXPECT_TRUE(c.stop());
}

// The reference user's llama-server command line (issue 27), run by scripts/moe-server with the
// model, the ports and the context size aside: it starts on a
// machine without a GPU (-ngl warns and runs on the CPU), serves a streamed chat on --port (HTTP,
// as llama-server), and its sampling flags are the server's defaults (-n caps a request that sets
// no limit; a request's own value wins).
TEST(LlamaServerCommand, ReferenceCommandServesWithItsDefaults) {
  ::setenv("MOE_BIN_DIR", kBinDir.c_str(), 1);
  const std::string ready =
      (std::filesystem::temp_directory_path() / ("moe_server_ready_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove(ready);
  auto server = model::ChildProcess::spawn(
      {std::string(MOE_SOURCE_DIR) + "/scripts/moe-server",
       "-m",
       model_path(),
       "--alias",
       "hz",
       "--host",
       "127.0.0.1",
       "-ctk",
       "q4_0",
       "-ctv",
       "q4_0",
       "-ctv-first",
       "q8_0,4",
       "-ctv-last",
       "q8_0,4",
       "-cmoe",
       "-b",
       "3072",
       "-ub",
       "1536",
       "--ctx-size",
       "4096",
       "--jinja",
       "-fa",
       "on",
       "--no-mmap",
       "--no-context-shift",
       "--temp",
       "0.6",
       "--top-k",
       "24",
       "--top-p",
       "0.95",
       "--min-p",
       "0.00",
       "-ngl",
       "999",
       "-np",
       "1",
       "--samplers",
       "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature",
       "--moe-resident",
       "auto",
       "--moe-resident-mib",
       "1024",
       "--k-cache-hadamard",
       "--v-cache-hadamard",
       "--moe-resident-profiler",
       "old",
       "--moe-resident-grouping",
       "off",
       "--port",
       "0",
       "--grpc-port",
       "0",
       "-n",
       "5",
       "--ready-file",
       ready});
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(ready) && server.running() &&
         std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(server.running()) << server.describe();
  std::ifstream f(ready);
  std::string grpc_addr, line;
  std::getline(f, grpc_addr);
  std::getline(f, line);
  ASSERT_EQ(line.rfind("http ", 0), 0u) << line;
  const std::string base = "http://" + line.substr(5);

  const std::string chat = R"({"messages":[{"role":"user","content":"Hi"}],"stream":true,)"
                           R"("stream_options":{"include_usage":true})";
  const HttpReply r = curl("POST", base + "/v1/chat/completions", chat + "}");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("data: [DONE]"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find(R"("completion_tokens":5)"), std::string::npos) << r.body;  // -n 5
  const HttpReply own = curl("POST", base + "/v1/chat/completions", chat + R"(,"max_tokens":2})");
  EXPECT_NE(own.body.find(R"("completion_tokens":2)"), std::string::npos) << own.body;
  EXPECT_EQ(json::parse(curl("GET", base + "/v1/models").body)["data"][0]["id"], "hz");
  // -ctk q4_0 -ctv q4_0 with the first and last 4 attention layers' V in q8_0 (the shared model
  // has 3: all of them), rotated.
  const std::string kv = json::parse(curl("GET", base + "/props").body)["kv_cache"];
  EXPECT_NE(kv.find("K q4_0 V q8_0"), std::string::npos) << kv;
  EXPECT_NE(kv.find("Hadamard-rotated"), std::string::npos) << kv;
  ::kill(server.pid(), SIGTERM);
  ASSERT_TRUE(server.wait_for(std::chrono::seconds(20)));
  EXPECT_EQ(server.exit_code(), 0);
}

// What does not exist yet fails at start with one line naming the flag, never silently.
TEST(LlamaServerCommand, FlagsOfMissingFeaturesAreRefusedClearly) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-np", "2", "-c", "1"}, "cannot give each of -np 2 slots a position"},
      {{"-ctv-first", "q8_0"}, "-ctv-first 'q8_0': expected TYPE,N"},
      {{"--no-kv-rotation", "--k-cache-hadamard"}, "--no-kv-rotation contradicts"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> argv = {kBinDir + "/moe-coordinator",
                                     "-m",
                                     model_path(),
                                     "--port",
                                     "0",
                                     "--placement",
                                     "in-process"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const std::string log =
        (std::filesystem::temp_directory_path() / ("moe_flags_" + std::to_string(::getpid())))
            .string();
    std::string cmd;
    for (const std::string& a : argv) cmd += "'" + a + "' ";
    cmd += "2>" + log;
    EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 1) << flags[0];
    std::ifstream f(log);
    const std::string out((std::istreambuf_iterator<char>(f)), {});
    EXPECT_NE(out.find(message), std::string::npos) << flags[0] << ": " << out;
    std::filesystem::remove(log);
  }
}

}  // namespace
}  // namespace moe::test
