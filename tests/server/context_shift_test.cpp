// --context-shift through the whole server, -c 64: a request for 120 tokens gets all 120 (the
// context shifts as it fills; finish reason length, from max_tokens), over gRPC and HTTP with
// n_keep; without the flag the same request stops when the context is full (finish reason
// context, as before); n_keep below -1 is refused. qwen35moe (a recurrent state, which cannot
// shift) starts with a warning and stops at the context as without the flag.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
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

constexpr int64_t kCtx = 64;
constexpr int kWanted = 120;

std::string qwen3_model() {
  return (testdata_dir() / "models/tiny-qwen3moe-sv-Q8_0.gguf").string();
}

// A prompt of 10 token ids; greedy, end-of-generation ignored.
v1::GenerateRequest request(int max_tokens) {
  v1::GenerateRequest req;
  for (int32_t t = 100; t < 110; ++t) req.mutable_tokens()->add_ids(t);
  req.set_max_tokens(max_tokens);
  req.mutable_sampling()->set_temperature(0.0f);
  req.set_ignore_eos(true);
  return req;
}

TEST(ContextShift, GenerationGoesPastAFullContext) {
  Coordinator c(qwen3_model(), {"-c", std::to_string(kCtx), "--context-shift", "--placement",
                                "in-process", "--http-port", "0"});
  for (const int n_keep : {0, 4, -1}) {
    v1::GenerateRequest req = request(kWanted);
    req.set_n_keep(n_keep);
    const StreamResult r = run_stream(*c.gen, req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.finish.reason(), v1::FINISH_REASON_LENGTH) << "n_keep " << n_keep;
    EXPECT_EQ(r.finish.completion_tokens(), kWanted);
    EXPECT_EQ(static_cast<int>(r.tokens.size()), kWanted);
  }
  const std::string url = "http://" + c.http_addr() + "/v1/completions";
  const HttpReply h = curl("POST", url,
                           R"({"prompt":"Count forever:","max_tokens":120,"ignore_eos":true,)"
                           R"("temperature":0,"n_keep":2})");
  ASSERT_EQ(h.status, 200) << h.body;
  const json body = json::parse(h.body);
  EXPECT_EQ(body["usage"]["completion_tokens"], kWanted) << h.body;
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length") << h.body;
  const HttpReply bad = curl("POST", url, R"({"prompt":"Hi","n_keep":-2})");
  EXPECT_EQ(bad.status, 400) << bad.body;
  v1::GenerateRequest refused = request(4);
  refused.set_n_keep(-5);
  EXPECT_EQ(run_stream(*c.gen, refused).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(c.stop());
}

TEST(ContextShift, WithoutTheFlagAFullContextEndsTheGeneration) {
  Coordinator c(qwen3_model(), {"-c", std::to_string(kCtx), "--placement", "in-process"});
  const StreamResult r = run_stream(*c.gen, request(kWanted));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finish.reason(), v1::FINISH_REASON_CONTEXT);
  EXPECT_EQ(r.finish.completion_tokens(), kCtx - 10 + 1);  // the last one is never evaluated
  EXPECT_TRUE(c.stop());
}

// qwen35moe cannot shift: a warning at start, then as --no-context-shift. The coordinator runs
// through a shell that sends its stderr to a file (the harness lets it inherit ours).
TEST(ContextShift, RecurrentModelsWarnAndStopAtTheContext) {
  const std::string model =
      (qwen35moe_testdata_dir() / "models/tiny-qwen35moe-sv-Q8_0.gguf").string();
  const auto tmp = std::filesystem::temp_directory_path();
  const std::string tag = std::to_string(::getpid());
  const std::string ready = (tmp / ("moe_ctx_shift_ready_" + tag)).string();
  const std::string log = (tmp / ("moe_ctx_shift_log_" + tag)).string();
  std::filesystem::remove(ready);
  const std::string cmd = "exec '" + kBinDir + "/moe-coordinator' -m '" + model +
                          "' --port 0 --ready-file '" + ready + "' --placement in-process -c " +
                          std::to_string(kCtx) + " --context-shift 2>'" + log + "'";
  model::ChildProcess proc = model::ChildProcess::spawn({"/bin/sh", "-c", cmd});
  ASSERT_TRUE(wait_until([&] { return std::filesystem::exists(ready) || !proc.running(); },
                         std::chrono::seconds(60)));
  ASSERT_TRUE(proc.running()) << proc.describe();
  std::string addr;
  std::getline(std::ifstream(ready), addr);
  auto gen = v1::Generation::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  const StreamResult r = run_stream(*gen, request(kWanted));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finish.reason(), v1::FINISH_REASON_CONTEXT);
  EXPECT_EQ(r.finish.completion_tokens(), kCtx - 10 + 1);
  ::kill(proc.pid(), SIGTERM);
  ASSERT_TRUE(proc.wait_for(std::chrono::seconds(20)));
  EXPECT_EQ(proc.exit_code(), 0);
  std::ifstream f(log);
  const std::string out((std::istreambuf_iterator<char>(f)), {});
  EXPECT_NE(out.find("warning: --context-shift"), std::string::npos) << out;
  std::filesystem::remove(log);
  std::filesystem::remove(ready);
}

}  // namespace
}  // namespace moe::test
