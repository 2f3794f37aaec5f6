// The gRPC API of a running coordinator: bad requests answered INVALID_ARGUMENT with a message
// naming the problem, the tokenizer and chat-template calls against the goldens, health (a real
// step), concurrent clients served in arrival order, stop strings, Drain and Shutdown, and moe-cli.
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "tests/server/coordinator_harness.h"
#include "tests/testdata.h"

namespace moe::test {
namespace {

std::string model_path() { return (testdata_dir() / "models/tiny-qwen3moe-sv-Q8_0.gguf").string(); }

class Api : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { coord_ = new Coordinator(model_path(), {"-c", "256"}); }
  static void TearDownTestSuite() {
    EXPECT_TRUE(coord_->stop());
    EXPECT_TRUE(segments_of(coord_->pid()).empty());
    delete coord_;
  }
  static Coordinator* coord_;
};
Coordinator* Api::coord_ = nullptr;

v1::GenerateRequest text_request(const std::string& text, int max_tokens) {
  v1::GenerateRequest r;
  r.set_text(text);
  r.set_max_tokens(max_tokens);
  r.set_seed(7);
  return r;
}

TEST_F(Api, BadRequestsAreInvalidArgumentWithAReason) {
  struct Case {
    const char* name;
    std::function<void(v1::GenerateRequest&)> make;
    const char* expect;  // part of the message
  };
  const std::vector<Case> cases = {
      {"no input", [](v1::GenerateRequest&) {}, "no input"},
      {"empty text", [](v1::GenerateRequest& r) { r.set_text(""); }, "text is empty"},
      {"invalid UTF-8", [](v1::GenerateRequest& r) { r.set_text("ab\xC3\x28"); }, "UTF-8 (byte 2)"},
      {"empty tokens", [](v1::GenerateRequest& r) { r.mutable_tokens(); }, "tokens.ids is empty"},
      {"token out of range",
       [](v1::GenerateRequest& r) {
         r.mutable_tokens()->add_ids(1);
         r.mutable_tokens()->add_ids(1 << 30);
       },
       "tokens.ids[1]"},
      {"context overflow",
       [](v1::GenerateRequest& r) {
         for (int i = 0; i < 300; ++i) r.mutable_tokens()->add_ids(5);
       },
       "the context holds 256"},
      {"negative max_tokens",
       [](v1::GenerateRequest& r) {
         r.set_text("hi");
         r.set_max_tokens(-1);
       },
       "max_tokens"},
      {"top_p out of range",
       [](v1::GenerateRequest& r) {
         r.set_text("hi");
         r.mutable_sampling()->set_top_p(1.5f);
       },
       "top_p"},
      {"NaN temperature",
       [](v1::GenerateRequest& r) {
         r.set_text("hi");
         r.mutable_sampling()->set_temperature(std::nanf(""));
       },
       "temp"},
      {"unknown sampler",
       [](v1::GenerateRequest& r) {
         r.set_text("hi");
         r.mutable_sampling()->set_samplers("top_k;warp_drive");
       },
       "warp_drive"},
      {"empty stop string",
       [](v1::GenerateRequest& r) {
         r.set_text("hi");
         r.add_stop("");
       },
       "stop[0] is empty"},
      {"empty chat", [](v1::GenerateRequest& r) { r.mutable_chat(); }, "chat.messages is empty"},
      {"bad role",
       [](v1::GenerateRequest& r) {
         auto* m = r.mutable_chat()->add_messages();
         m->set_role("wizard");
         m->set_content("hi");
       },
       "chat.messages[0].role 'wizard'"},
      {"unknown field in a chat message",
       [](v1::GenerateRequest& r) {
         auto* m = r.mutable_chat()->add_messages();
         m->set_role("user");
         m->set_content("hi");
         m->GetReflection()->MutableUnknownFields(m)->AddVarint(42, 1);
       },
       "chat.messages[0] has an unknown field (number 42)"},
      {"invalid UTF-8 in a chat message",
       [](v1::GenerateRequest& r) {
         auto* m = r.mutable_chat()->add_messages();
         m->set_role("user");
         m->set_content("\xFF");
       },
       "chat.messages[0].content is not valid UTF-8"},
      {"tool call arguments not JSON",
       [](v1::GenerateRequest& r) {
         auto* u = r.mutable_chat()->add_messages();
         u->set_role("user");
         u->set_content("weather?");
         auto* m = r.mutable_chat()->add_messages();
         m->set_role("assistant");
         auto* c = m->add_tool_calls();
         c->set_name("get_weather");
         c->set_arguments_json("{city:");
       },
       "chat.messages[1].tool_calls[0].arguments_json is not valid JSON"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::GenerateRequest req;
    c.make(req);
    const StreamResult r = run_stream(*coord_->gen, req, std::chrono::seconds(10));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(r.status.error_message().find(c.expect), std::string::npos)
        << r.status.error_message();
    EXPECT_FALSE(r.finished);
  }
  // Nothing above reached the engine, and it still works.
  const StreamResult ok = run_stream(*coord_->gen, text_request("Hello", 3));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

TEST_F(Api, TokenizeAndChatTemplateMatchTheGoldens) {
  const auto dir = testdata_dir() / "golden/tiny-qwen3moe-sv-Q8_0";
  // The raw prompt's golden token ids (no BOS for this model).
  std::ifstream f(testdata_dir() / "golden/prompts/raw.txt", std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(f)), {});
  v1::TokenizeRequest tr;
  tr.set_text(raw);
  tr.set_parse_special(true);
  tr.set_add_special(true);
  tr.set_with_pieces(true);
  v1::TokenizeResponse tresp;
  grpc::ClientContext c1;
  c1.set_deadline(in(std::chrono::seconds(10)));
  ASSERT_TRUE(coord_->gen->Tokenize(&c1, tr, &tresp).ok());
  const auto golden = read_raw<int32_t>(dir / "raw/prompt_tokens.i32");
  EXPECT_EQ(std::vector<int32_t>(tresp.ids().begin(), tresp.ids().end()), golden);
  ASSERT_EQ(tresp.pieces_size(), tresp.ids_size());

  v1::DetokenizeRequest dr;
  for (int32_t id : golden) dr.add_ids(id);
  v1::DetokenizeResponse dresp;
  grpc::ClientContext c2;
  c2.set_deadline(in(std::chrono::seconds(10)));
  ASSERT_TRUE(coord_->gen->Detokenize(&c2, dr, &dresp).ok());
  EXPECT_EQ(dresp.text(), raw);

  // The chat prompt: system + user with the generation prompt, rendered and tokenized.
  v1::ApplyChatTemplateRequest ar;
  auto* sys = ar.mutable_chat()->add_messages();
  sys->set_role("system");
  sys->set_content("You are a helpful assistant.");
  auto* user = ar.mutable_chat()->add_messages();
  user->set_role("user");
  user->set_content("Write a haiku about mixture-of-experts models.");
  ar.set_tokenize(true);
  v1::ApplyChatTemplateResponse aresp;
  grpc::ClientContext c3;
  c3.set_deadline(in(std::chrono::seconds(10)));
  ASSERT_TRUE(coord_->gen->ApplyChatTemplate(&c3, ar, &aresp).ok());
  std::ifstream cf(testdata_dir() / "golden/prompts/chat.txt", std::ios::binary);
  const std::string chat((std::istreambuf_iterator<char>(cf)), {});
  EXPECT_EQ(aresp.text(), chat);
  EXPECT_EQ(std::vector<int32_t>(aresp.ids().begin(), aresp.ids().end()),
            read_raw<int32_t>(dir / "chat/prompt_tokens.i32"));
}

TEST_F(Api, HealthCheckRunsAStep) {
  grpc::health::v1::HealthCheckRequest hr;
  grpc::health::v1::HealthCheckResponse hresp;
  grpc::ClientContext c1;
  c1.set_deadline(in(std::chrono::seconds(10)));
  ASSERT_TRUE(coord_->health->Check(&c1, hr, &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  hr.set_service("no.such.Service");
  grpc::ClientContext c2;
  c2.set_deadline(in(std::chrono::seconds(10)));
  EXPECT_EQ(coord_->health->Check(&c2, hr, &hresp).error_code(), grpc::StatusCode::NOT_FOUND);
}

// Server reflection's ListServices, spoken through a generic stub with a hand-encoded request
// (the reflection proto's C++ code is not installed by Debian): field 7 `list_services` = "".
std::string list_services(grpc::Channel& channel) {
  grpc::GenericStub stub(channel.shared_from_this());
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(10)));
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto step = [&](void* tag) {
    void* got = nullptr;
    bool ok = false;
    return cq.Next(&got, &ok) && got == tag && ok;
  };
  int tags[5];
  call->StartCall(&tags[0]);
  if (!step(&tags[0])) return "";
  const char req_bytes[] = {0x3A, 0x00};
  grpc::Slice slice(req_bytes, sizeof req_bytes);
  grpc::ByteBuffer req(&slice, 1);
  call->Write(req, &tags[1]);
  if (!step(&tags[1])) return "";
  call->WritesDone(&tags[2]);
  if (!step(&tags[2])) return "";
  grpc::ByteBuffer resp;
  call->Read(&resp, &tags[3]);
  if (!step(&tags[3])) return "";
  std::vector<grpc::Slice> slices;
  (void)resp.Dump(&slices);
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  grpc::Status status;
  call->Finish(&status, &tags[4]);
  step(&tags[4]);
  cq.Shutdown();
  return out;
}

TEST_F(Api, ReflectionListsOurServices) {
  const std::string listing = list_services(*coord_->channel());
  for (const char* name : {"moe.v1.Generation", "moe.v1.Control", "grpc.health.v1.Health"}) {
    EXPECT_NE(listing.find(name), std::string::npos) << name;
  }
}

// logit_bias through the API: banning the greedy first token changes it, a large bias on one
// token makes every step choose it, and an id past the vocabulary is INVALID_ARGUMENT.
TEST_F(Api, LogitBiasBansAndForcesTokens) {
  v1::GenerateRequest req = text_request("The capital of France is", 4);
  req.mutable_sampling()->set_temperature(0.0f);
  req.set_ignore_eos(true);
  const StreamResult plain = run_stream(*coord_->gen, req);
  ASSERT_TRUE(plain.status.ok());
  ASSERT_EQ(plain.tokens.size(), 4u);
  v1::GenerateRequest ban = req;
  (*ban.mutable_sampling()->mutable_logit_bias())[plain.tokens[0]] = -INFINITY;
  const StreamResult banned = run_stream(*coord_->gen, ban);
  ASSERT_TRUE(banned.status.ok());
  ASSERT_FALSE(banned.tokens.empty());
  EXPECT_NE(banned.tokens[0], plain.tokens[0]);
  for (int32_t t : banned.tokens) EXPECT_NE(t, plain.tokens[0]);
  v1::GenerateRequest force = req;
  (*force.mutable_sampling()->mutable_logit_bias())[1234] = 1000.0f;
  const StreamResult forced = run_stream(*coord_->gen, force);
  ASSERT_TRUE(forced.status.ok());
  EXPECT_EQ(forced.tokens, std::vector<int32_t>(4, 1234));
  v1::GenerateRequest outside = req;
  (*outside.mutable_sampling()->mutable_logit_bias())[1 << 30] = 1.0f;
  const StreamResult refused = run_stream(*coord_->gen, outside);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("outside the vocabulary"), std::string::npos)
      << refused.status.error_message();
}

// Constrained output over gRPC: a GBNF grammar and a JSON Schema shape the text exactly, and the
// generation ends when the grammar is complete; a bad grammar is INVALID_ARGUMENT naming it.
TEST_F(Api, GrammarsAndSchemasConstrainTheOutput) {
  v1::GenerateRequest req = text_request("Answer:", 64);
  req.set_grammar(R"(root ::= "The answer is " ("yes" | "no") ", " [0-9]{1,3} ".")");
  for (uint32_t seed : {1u, 2u, 3u}) {
    req.set_seed(seed);
    const StreamResult r = run_stream(*coord_->gen, req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_TRUE(std::regex_match(r.text, std::regex("The answer is (yes|no), [0-9]{1,3}\\.")))
        << r.text;
    EXPECT_EQ(r.finish.reason(), v1::FINISH_REASON_EOG);
  }
  v1::GenerateRequest js = text_request("Data:", 200);
  js.set_json_schema(R"({"type": "object", "additionalProperties": false, "required": ["n", "ok"],
                         "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}}})");
  const StreamResult j = run_stream(*coord_->gen, js);
  ASSERT_TRUE(j.status.ok()) << j.status.error_message();
  const nlohmann::json doc = nlohmann::json::parse(j.text);
  EXPECT_TRUE(doc.at("n").is_number_integer()) << j.text;
  EXPECT_TRUE(doc.at("ok").is_boolean()) << j.text;
  EXPECT_EQ(doc.size(), 2u);
  for (const char* bad : {"root ::= nothing-here", "root ::= [a-", "root ::= root \"x\""}) {
    v1::GenerateRequest b = text_request("x", 4);
    b.set_grammar(bad);
    const StreamResult r = run_stream(*coord_->gen, b);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_NE(r.status.error_message().find("grammar"), std::string::npos)
        << r.status.error_message();
  }
  v1::GenerateRequest schema = text_request("x", 4);
  schema.set_json_schema(R"({"type": "string", "pattern": "a+"})");
  const StreamResult r = run_stream(*coord_->gen, schema);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("json_schema"), std::string::npos)
      << r.status.error_message();
}

// Each chunk carries its tokens' log-probabilities: greedy picks the first of the top list, which
// is in descending order and sums to at most one.
TEST_F(Api, LogprobsComeWithEveryToken) {
  v1::GenerateRequest req = text_request("The capital of France is", 6);
  req.mutable_sampling()->set_temperature(0.0f);
  req.set_ignore_eos(true);
  req.set_logprobs(true);
  req.set_top_logprobs(4);
  const StreamResult r = run_stream(*coord_->gen, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.logprobs.size(), r.tokens.size());
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    const v1::TokenLogprobs& lp = r.logprobs[i];
    EXPECT_EQ(lp.token().id(), r.tokens[i]);
    ASSERT_EQ(lp.top_size(), 4);
    EXPECT_EQ(lp.top(0).id(), lp.token().id());
    EXPECT_FLOAT_EQ(lp.top(0).logprob(), lp.token().logprob());
    double sum = 0;
    for (int k = 0; k < lp.top_size(); ++k) {
      EXPECT_LE(lp.top(k).logprob(), 0.0f);
      if (k > 0) {
        EXPECT_LE(lp.top(k).logprob(), lp.top(k - 1).logprob());
      }
      EXPECT_FALSE(lp.top(k).piece().empty());
      sum += std::exp(lp.top(k).logprob());
    }
    EXPECT_LE(sum, 1.0 + 1e-5);
  }
  req.set_top_logprobs(21);
  EXPECT_EQ(run_stream(*coord_->gen, req).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(Api, StopStringsEndGenerationAndAreNotSent) {
  // Learn what the model says, then stop at a piece of it.
  v1::GenerateRequest req = text_request("The capital of France is", 16);
  req.mutable_sampling()->set_temperature(0.0f);
  req.set_ignore_eos(true);
  const StreamResult full = run_stream(*coord_->gen, req);
  ASSERT_TRUE(full.status.ok());
  ASSERT_GE(full.text.size(), 6u);
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  req.add_stop(stop);
  const StreamResult cut = run_stream(*coord_->gen, req);
  ASSERT_TRUE(cut.status.ok());
  ASSERT_TRUE(cut.finished);
  EXPECT_EQ(cut.finish.reason(), v1::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(cut.finish.stop_string(), stop);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
}

TEST_F(Api, ConcurrentClientsAllCompleteInArrivalOrder) {
  constexpr int kClients = 4;
  std::vector<StreamResult> results(kClients);
  std::vector<std::chrono::steady_clock::time_point> done(kClients);
  std::vector<std::thread> threads;
  const uint64_t accepted0 = coord_->stats().requests_accepted();
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest req = text_request("client " + std::to_string(i), 12);
      req.set_ignore_eos(true);
      results[static_cast<size_t>(i)] = run_stream(*coord_->gen, req);
      done[static_cast<size_t>(i)] = std::chrono::steady_clock::now();
    });
    // The next client arrives only once this one is in the queue: a defined order.
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (coord_->stats().requests_accepted() < accepted0 + static_cast<uint64_t>(i) + 1 &&
           std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    const StreamResult& r = results[static_cast<size_t>(i)];
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
    EXPECT_EQ(r.finish.completion_tokens(), 12);
    if (i > 0) {
      EXPECT_LT(done[static_cast<size_t>(i - 1)], done[static_cast<size_t>(i)]) << i;
    }
  }
}

TEST_F(Api, PerLayerStatsCountEveryRoutedExpert) {
  const v1::GetStatsResponse before = coord_->stats();
  const StreamResult r = run_stream(*coord_->gen, text_request("Layers, please", 5));
  ASSERT_TRUE(r.status.ok());
  const v1::GetStatsResponse after = coord_->stats();
  ASSERT_GT(after.layers_size(), 0);
  ASSERT_EQ(after.layers_size(), before.layers_size());
  const uint64_t tokens = after.layers(0).tokens() - before.layers(0).tokens();
  // The prompt batch plus one decode step per generated token but the last.
  EXPECT_EQ(tokens,
            static_cast<uint64_t>(r.finish.prompt_tokens() + r.finish.completion_tokens() - 1));
  EXPECT_FALSE(after.has_experts());  // CPU only: no GPU expert runtime to report
  for (int l = 0; l < after.layers_size(); ++l) {
    const auto& a = after.layers(l);
    const auto& b = before.layers(l);
    EXPECT_EQ(a.layer(), l);
    EXPECT_EQ(a.tokens() - b.tokens(), tokens) << l;
    // Every token of every layer goes to n_expert_used = 4 experts of this model, all on the CPU.
    EXPECT_EQ(a.routed() - b.routed(), 4 * tokens) << l;
    EXPECT_EQ(a.gpu_misses(), a.routed()) << l;
    EXPECT_EQ(a.gpu_hits(), 0u) << l;
    EXPECT_GT(a.expert_ms(), b.expert_ms()) << l;
  }
}

TEST_F(Api, SameSeedSameText) {
  v1::GenerateRequest req = text_request("Once upon a time", 10);
  req.mutable_sampling()->set_temperature(0.8f);
  req.set_ignore_eos(true);
  const StreamResult a = run_stream(*coord_->gen, req);
  const StreamResult b = run_stream(*coord_->gen, req);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.finish.seed(), 7u);
}

TEST_F(Api, MoeCliGeneratesTokenizesAndReportsStats) {
  const std::string cli = kBinDir + "/moe-cli --addr " + coord_->addr() + " --timeout 30 ";
  auto run = [](const std::string& cmd, int* rc) {
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    *rc = WEXITSTATUS(::pclose(p));
    return out;
  };
  int rc = -1;
  // The same request through the API and through the CLI give the same tokens.
  v1::GenerateRequest req = text_request("Hello there", 8);
  req.mutable_sampling()->set_temperature(0.0f);
  req.set_ignore_eos(true);
  const StreamResult api = run_stream(*coord_->gen, req);
  ASSERT_TRUE(api.status.ok());
  const std::string text =
      run(cli + "generate -p 'Hello there' -n 8 --temp 0 --ignore-eos -s 7 2>/dev/null", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(text, api.text);

  const std::string ids = run(cli + "tokenize 'Hello there'", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_FALSE(ids.empty());
  const std::string stats = run(cli + "stats --json", &rc);
  EXPECT_EQ(rc, 0);
  const auto j = nlohmann::json::parse(stats, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << stats;
  EXPECT_NE(stats.find("cpu-0"), std::string::npos) << stats;
  const std::string table = run(cli + "stats", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(table.find("LAYER"), std::string::npos) << table;
  // --watch without a terminal appends one snapshot per interval until stopped.
  const std::string watched = run("timeout 0.5 " + cli + "stats --watch --interval 0.1", &rc);
  size_t snapshots = 0;
  for (size_t at = watched.find("model:"); at != std::string::npos;
       at = watched.find("model:", at + 1)) {
    ++snapshots;
  }
  EXPECT_GE(snapshots, 2u) << watched;

  // A dead address is a clear error, not a hang.
  run(kBinDir + "/moe-cli --addr 127.0.0.1:1 --timeout 2 tokenize hi 2>/dev/null", &rc);
  EXPECT_EQ(rc, 1);

  // The experts' live policy: a CPU-only server has none and says why (exit 1); a bad value is
  // a usage error naming the option (exit 2) before anything is sent.
  const std::string refused = run(cli + "policy 2>&1", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(refused.find("FAILED_PRECONDITION"), std::string::npos) << refused;
  EXPECT_NE(refused.find("-cmoe"), std::string::npos) << refused;
  const std::string bad = run(cli + "policy --stream-share 1.5 2>&1", &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(bad.find("--stream-share"), std::string::npos) << bad;
  run(cli + "policy --profiler fast 2>/dev/null", &rc);
  EXPECT_EQ(rc, 2);
}

TEST_F(Api, PlacementListsEveryLayersExpertsOnTheCpu) {
  grpc::ClientContext ctx;
  v1::GetPlacementResponse p;
  const grpc::Status st = coord_->control->GetPlacement(&ctx, v1::GetPlacementRequest(), &p);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_GT(p.layers_size(), 0);
  for (int i = 0; i < p.layers_size(); ++i) {
    const v1::LayerPlacement& l = p.layers(i);
    EXPECT_EQ(l.layer(), i);
    EXPECT_FALSE(l.gpu_home());
    EXPECT_EQ(l.vram() + l.direct(), 0);
    EXPECT_GT(l.cpu(), 0);
  }
  // SetExpertPolicy checks its values before it looks for a GPU forward.
  grpc::ClientContext ctx2;
  v1::SetExpertPolicyRequest req;
  req.set_stream_share(7);
  v1::ExpertPolicyResponse resp;
  EXPECT_EQ(coord_->control->SetExpertPolicy(&ctx2, req, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace moe::test
