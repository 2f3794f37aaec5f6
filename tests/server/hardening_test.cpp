// What an attacker or an unlucky client does to a running coordinator, each case failing on the
// server before it was hardened: JSON nested 70,000 deep (HTTP and gRPC), invalid UTF-8, gRPC
// without or with a wrong API key and worker-only calls from outside, a client that leaves a whole
// completion, idle connections, a second server on a port in use, origins and Host headers.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tests/server/coordinator_harness.h"
#include "tests/server/http_client.h"
#include "tests/testdata.h"

namespace moe::test {
namespace {

using json = nlohmann::json;
using Ms = std::chrono::milliseconds;

std::string model_path() { return (testdata_dir() / "models/tiny-qwen3moe-sv-Q8_0.gguf").string(); }

// `depth` arrays inside each other around a 1: the shape that overflowed the stack in dump().
std::string nested(size_t depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

std::string chat_with(const std::string& extra_json_fields) {
  return R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":2)" + extra_json_fields + "}";
}

// Seconds since `t`.
double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

class Hardening : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    coord_ = new Coordinator(
        model_path(), {"-c", "4096", "--http-port", "0", "--cors-origin", "http://app.example"});
    base_ = "http://" + coord_->http_addr();
  }
  static void TearDownTestSuite() {
    EXPECT_TRUE(coord_->stop());
    delete coord_;
  }
  static void expect_healthy() {
    EXPECT_EQ(curl("GET", base_ + "/health").status, 200);
    const HttpReply r = curl("POST", base_ + "/v1/chat/completions", chat_with(""));
    EXPECT_EQ(r.status, 200) << r.body;
  }
  static Coordinator* coord_;
  static std::string base_;
};
Coordinator* Hardening::coord_ = nullptr;
std::string Hardening::base_;

TEST_F(Hardening, DeeplyNestedJsonIs400AndTheServerLives) {
  const std::string deep = nested(70000);
  const std::string tools =
      R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)" + deep + "}}]";
  const std::string call =
      R"(,"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":)" +
      deep + "}}]}]";
  const std::string part =
      R"(,"messages":[{"role":"user","content":[{"type":"text","text":"a","extra":)" + deep +
      "}]}]";
  for (const std::string& extra : {tools, part}) {
    expect_error(curl("POST", base_ + "/v1/chat/completions", chat_with(extra)), 400,
                 "nested deeper than");
  }
  // tool_calls replace the messages: a body of its own.
  expect_error(curl("POST", base_ + "/v1/chat/completions", "{\"max_tokens\":2" + call + "}"), 400,
               "nested deeper than");
  // As a browser's "simple" request would send it (no preflight), too.
  expect_error(curl("POST", base_ + "/v1/chat/completions", chat_with(tools),
                    "-H 'Content-Type: text/plain'"),
               400, "nested deeper than");
  expect_healthy();
}

TEST_F(Hardening, DeeplyNestedJsonOverGrpcIsInvalidArgument) {
  v1::GenerateRequest req;
  v1::ChatMessage& m = *req.mutable_chat()->add_messages();
  m.set_role("user");
  m.set_content("hi");
  req.mutable_chat()->add_tools_json(R"({"type":"function","function":{"name":"f","parameters":)" +
                                     nested(70000) + "}}");
  req.set_max_tokens(2);
  grpc::ClientContext ctx;
  ctx.set_deadline(in(Ms(30000)));
  const StreamResult r = run_stream(*coord_->gen, req, ctx, [](const StreamResult&) {});
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("nested deeper than"), std::string::npos)
      << r.status.error_message();
  expect_healthy();
}

TEST_F(Hardening, InvalidUtf8Is400) {
  expect_error(curl("POST", base_ + "/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"a)" + std::string("\xff\xfe") +
                        R"("}],"max_tokens":2})"),
               400, "not valid JSON");
  expect_error(curl("POST", base_ + "/v1/completions",
                    std::string(R"({"prompt":")") + "\xc3" + R"(","max_tokens":2})"),
               400, "not valid JSON");
}

TEST_F(Hardening, SamplingErrorsSayTheirPrefixOnce) {
  const HttpReply r =
      curl("POST", base_ + "/v1/completions", R"({"prompt":"hi","max_tokens":2,"top_p":1.5})");
  expect_error(r, 400, "sampling: top_p");
  EXPECT_EQ(r.body.find("sampling: sampling"), std::string::npos) << r.body;
}

TEST_F(Hardening, AbandonedWholeCompletionFreesTheEngineWithinOneSecond) {
  const std::string body =
      R"({"prompt":"Count forever:","max_tokens":3000,"ignore_eos":true,"stream":false})";
  // curl gives up after 1.5 s, mid-generation (3000 tokens take far longer on this model).
  const auto t0 = std::chrono::steady_clock::now();
  const HttpReply r = curl("POST", base_ + "/v1/completions", body, "--max-time 1.5 -o /dev/null");
  const auto gave_up = std::chrono::steady_clock::now();
  EXPECT_LT(since(t0), 5.0) << r.body;
  bool idle = false;
  while (since(gave_up) < 1.0) {
    const v1::GetStatsResponse s = coord_->stats();
    if (s.running() == 0 && s.queue_depth() == 0) {
      idle = true;
      break;
    }
    std::this_thread::sleep_for(Ms(20));
  }
  EXPECT_TRUE(idle) << "the engine still ran the abandoned request 1 s after its client left";
  expect_healthy();
}

TEST_F(Hardening, HealthAnswersWithinOneSecondBeside64IdleConnections) {
  const std::string addr = coord_->http_addr();
  const int port = std::stoi(addr.substr(addr.rfind(':') + 1));
  std::vector<int> socks;
  for (int i = 0; i < 64; ++i) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(s, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    if (i % 2 == 1) ::send(s, "GET /heal", 9, 0);  // half of them stall inside their headers
    socks.push_back(s);
  }
  std::this_thread::sleep_for(Ms(200));
  const auto t0 = std::chrono::steady_clock::now();
  const HttpReply r = curl("GET", base_ + "/health", "", "--max-time 1");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_LT(since(t0), 1.0);
  for (int s : socks) ::close(s);
}

TEST_F(Hardening, OriginsAndHostHeaders) {
  // An allowed origin's preflight is answered with the CORS headers (it carries no API key).
  const HttpReply pre = curl("OPTIONS", base_ + "/v1/chat/completions", "",
                             "-i -H 'Origin: http://app.example' "
                             "-H 'Access-Control-Request-Method: POST'");
  EXPECT_EQ(pre.status, 204) << pre.body;
  EXPECT_NE(pre.body.find("Access-Control-Allow-Origin: http://app.example"), std::string::npos)
      << pre.body;
  EXPECT_NE(pre.body.find("Access-Control-Allow-Headers"), std::string::npos) << pre.body;
  const HttpReply ok = curl("POST", base_ + "/v1/chat/completions", chat_with(""),
                            "-i -H 'Origin: http://app.example'");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_NE(ok.body.find("Access-Control-Allow-Origin: http://app.example"), std::string::npos);
  // Any other page is refused before anything runs, preflight or not.
  expect_error(curl("POST", base_ + "/v1/chat/completions", chat_with(""),
                    "-H 'Origin: http://evil.example' -H 'Content-Type: text/plain'"),
               403, "not allowed");
  EXPECT_EQ(curl("OPTIONS", base_ + "/v1/chat/completions", "", "-H 'Origin: http://evil.example'")
                .status,
            403);
  // DNS rebinding: a loopback server answers only to loopback names.
  expect_error(curl("GET", base_ + "/v1/models", "", "-H 'Host: evil.example'"), 403,
               "not served here");
  EXPECT_EQ(curl("GET", base_ + "/v1/models", "", "-H 'Host: localhost'").status, 200);
}

// Calls `method` (full name) with an empty request; returns its status.
grpc::Status call_raw(grpc::GenericStub& stub, const std::string& method,
                      const std::string& key_header = "") {
  grpc::ClientContext ctx;
  ctx.set_deadline(in(Ms(5000)));
  if (!key_header.empty()) ctx.AddMetadata("authorization", key_header);
  grpc::ByteBuffer req, resp;
  grpc::Slice empty("");
  req = grpc::ByteBuffer(&empty, 1);
  grpc::Status status;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
    std::lock_guard lock(mu);
    status = s;
    done = true;
    cv.notify_all();
  });
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return done; });
  return status;
}

TEST(GrpcAuth, EveryMethodNeedsTheKeyAndWorkerCallsNeedTheWorkerSecret) {
  Coordinator c(model_path(), {"-c", "512", "--api-key", "sesame"});
  // Every client method of every service, without a key and with a wrong one.
  const std::vector<std::string> client_methods = {"/moe.v1.Generation/Tokenize",
                                                   "/moe.v1.Generation/Detokenize",
                                                   "/moe.v1.Generation/ApplyChatTemplate",
                                                   "/moe.v1.Control/GetStats",
                                                   "/moe.v1.Control/GetPlacement",
                                                   "/moe.v1.Control/Drain",
                                                   "/moe.v1.Control/Shutdown"};
  grpc::GenericStub stub(c.channel());
  for (const std::string& m : client_methods) {
    EXPECT_EQ(call_raw(stub, m).error_code(), grpc::StatusCode::UNAUTHENTICATED) << m;
    EXPECT_EQ(call_raw(stub, m, "Bearer wrong").error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << m;
  }
  // The worker-only calls: not even the API key opens them.
  for (const char* m : {"/moe.v1.Control/Register", "/moe.v1.Control/Heartbeat"}) {
    EXPECT_EQ(call_raw(stub, m, "Bearer sesame").error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << m;
  }
  // Generate (a stream) without and with the key.
  v1::GenerateRequest req;
  req.set_text("hello");
  req.set_max_tokens(2);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(in(Ms(10000)));
    const StreamResult r = run_stream(*c.gen, req, ctx, [](const StreamResult&) {});
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(in(Ms(30000)));
    ctx.AddMetadata("authorization", "Bearer sesame");
    const StreamResult r = run_stream(*c.gen, req, ctx, [](const StreamResult&) {});
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  }
  // The workers registered with the secret: the server is serving with its worker.
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer sesame");
  ctx.set_deadline(in(Ms(5000)));
  v1::GetStatsResponse stats;
  ASSERT_TRUE(c.control->GetStats(&ctx, {}, &stats).ok());
  EXPECT_GE(stats.workers_size(), 1);
  // Health stays open for probes.
  grpc::ClientContext hctx;
  hctx.set_deadline(in(Ms(5000)));
  grpc::health::v1::HealthCheckResponse h;
  EXPECT_TRUE(c.health->Check(&hctx, {}, &h).ok());
  // Shutdown without the key did nothing; with it the server still stops cleanly on SIGTERM.
  EXPECT_TRUE(c.process().running());
  EXPECT_TRUE(c.stop());
}

TEST(GrpcAuth, OffLoopbackWithoutAKeyIsRefused) {
  auto p = model::ChildProcess::spawn(
      {kBinDir + "/moe-coordinator", "-m", model_path(), "--port", "0", "--host", "0.0.0.0"});
  ASSERT_TRUE(p.wait_for(std::chrono::seconds(30)));
  EXPECT_EQ(p.exit_code(), 1);
}

// Starts a second coordinator with `args`; true when it refused to start (exit 1) within 30 s.
bool second_refused(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kBinDir + "/moe-coordinator", "-m", model_path(), "--placement",
                                   "in-process"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto p = model::ChildProcess::spawn(argv);
  if (!p.wait_for(std::chrono::seconds(30))) {
    p.kill();
    return false;
  }
  return p.exit_code() == 1;
}

TEST(Ports, InUseOrEqualPortsAreRefused) {
  Coordinator c(model_path(), {"-c", "512", "--http-port", "0", "--placement", "in-process"});
  const std::string grpc_port = c.addr().substr(c.addr().rfind(':') + 1);
  const std::string http_port = c.http_addr().substr(c.http_addr().rfind(':') + 1);
  EXPECT_TRUE(second_refused({"--port", grpc_port}));
  EXPECT_TRUE(second_refused({"--port", "0", "--http-port", http_port}));
  EXPECT_TRUE(second_refused({"--port", "47811", "--http-port", "47811"}));
  EXPECT_TRUE(c.process().running());
  EXPECT_TRUE(c.stop());
}

TEST(StuckWorker, StoppedWorkerFailsTheRequestWithinTheDeadlineThenTheNextSucceeds) {
  Coordinator c((testdata_dir() / "models/tiny-qwen3moe-sv-Q4_0.gguf").string(),
                {"-c", "4096", "--worker-silence-timeout", "2", "--http-port", "0"});
  const pid_t victim = c.placement().workers(0).pid();
  ASSERT_GT(victim, 0);
  v1::GenerateRequest req;
  req.set_text("Count forever:");
  req.set_ignore_eos(true);
  std::chrono::steady_clock::time_point stopped;
  grpc::ClientContext ctx;
  ctx.set_deadline(in(Ms(60000)));
  const StreamResult r = run_stream(*c.gen, req, ctx, [&](const StreamResult& s) {
    if (s.chunks == 3) {
      stopped = std::chrono::steady_clock::now();
      ::kill(victim, SIGSTOP);
    }
  });
  const double took = since(stopped);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("heartbeat"), std::string::npos)
      << r.status.error_message();
  EXPECT_LT(took, 5.0);  // the 2 s limit, a heartbeat interval, the 1 s ring poll, slack
  EXPECT_TRUE(gone_within(victim, Ms(2000)));
  // The next request starts a new worker and succeeds; HTTP health agrees with gRPC health.
  v1::GenerateRequest next;
  next.set_text("after");
  next.set_max_tokens(3);
  grpc::ClientContext ctx2;
  ctx2.set_deadline(in(Ms(60000)));
  const StreamResult again = run_stream(*c.gen, next, ctx2, [](const StreamResult&) {});
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(curl("GET", "http://" + c.http_addr() + "/health").status, 200);
  EXPECT_TRUE(c.stop());
}

TEST(Tls, GrpcAndHttpsServeWithTheGivenCertificate) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("moe_tls_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string key = (dir / "key.pem").string(), cert = (dir / "cert.pem").string();
  const std::string gen =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
      key + " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(gen.c_str()), 0);
  Coordinator c(model_path(), {"-c", "512", "--http-port", "0", "--placement", "in-process",
                               "--ssl-key-file", key, "--ssl-cert-file", cert});
  const std::string https = "https://" + c.http_addr();
  EXPECT_EQ(curl("GET", https + "/health", "", "--cacert " + cert).status, 200);
  EXPECT_NE(curl("GET", "http://" + c.http_addr() + "/health").status, 200);  // no plain HTTP

  std::ifstream f(cert);
  std::stringstream pem;
  pem << f.rdbuf();
  grpc::SslCredentialsOptions opt;
  opt.pem_root_certs = pem.str();
  const auto channel = grpc::CreateChannel(c.addr(), grpc::SslCredentials(opt));
  const auto gen_stub = v1::Generation::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(in(Ms(10000)));
  v1::TokenizeRequest treq;
  treq.set_text("hello");
  v1::TokenizeResponse tresp;
  const grpc::Status st = gen_stub->Tokenize(&ctx, treq, &tresp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_GT(tresp.ids_size(), 0);
  // A plaintext client gets nothing.
  grpc::ClientContext pctx;
  pctx.set_deadline(in(Ms(3000)));
  v1::TokenizeResponse presp;
  EXPECT_FALSE(c.gen->Tokenize(&pctx, treq, &presp).ok());
  EXPECT_TRUE(c.stop());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moe::test
