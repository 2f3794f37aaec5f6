// The routed experts' live policy (issue 29 §4) through the engine, moe.v1.Control, /metrics and
// moe-cli's formatting, in one process. A GPU forward's policy is played by PolicyModel: the tiny
// CPU model with a policy of its own that records when it is changed, so the test can check that
// a change lands between forwards while a generation runs, that a refused change changes nothing,
// and that every reader sees it. The CPU-only forward's refusal is checked on the real model.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/gguf.h"
#include "common/placement/placement.h"
#include "coordinator/cli/stats_table.h"
#include "coordinator/engine/engine.h"
#include "coordinator/engine/worker_registry.h"
#include "coordinator/http/metrics.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/server/control_service.h"
#include "coordinator/server/grpc_auth.h"
#include "coordinator/server/serving_state.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "kernels/cpu/thread_pool.h"
#include "moe/v1/control.grpc.pb.h"
#include "tests/testdata.h"

namespace moe::test {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kSlotBytes = 3 * kMiB;

// The tiny CPU model, with a policy as a GPU forward would hold one: a pool of kSlotBytes slots
// (up to 64 MiB), the shares and switches. Every layer is CPU-homed; the pool's slots go to the
// layers in turn.
class PolicyModel final : public model::ModelArch {
 public:
  explicit PolicyModel(model::ModelArch& inner) : inner_(inner) {
    policy_.pool_max_bytes = 64 * kMiB;
    policy_.slot_bytes = kSlotBytes;
    set_pool(12 * kMiB);
    policy_.stream_share = 0.3;
    policy_.prefill_cpu_share = 0.2;
  }

  std::string_view name() const override { return inner_.name(); }
  const model::ModelConfig& config() const override { return inner_.config(); }
  void forward(std::span<const int32_t> tokens, model::KvCache& cache, model::LogitsMode mode,
               float* logits, const model::ForwardHooks* hooks) override {
    in_forward_ = true;
    inner_.forward(tokens, cache, mode, logits, hooks);
    in_forward_ = false;
    ++forwards_;
  }

  std::optional<model::ExpertPolicy> expert_policy() const override { return policy_; }
  model::PolicyOutcome set_expert_policy(const model::ExpertPolicyChange& c) override {
    if (in_forward_) changed_during_forward_ = true;
    if (c.pool_mib && static_cast<uint64_t>(*c.pool_mib) * kMiB > policy_.pool_max_bytes) {
      return {model::PolicyOutcome::NoRoom,
              "a pool of " + std::to_string(*c.pool_mib) + " MiB does not fit the 64 MiB left"};
    }
    if (c.recalibrate) policy_.recalibrated_ms = 12.5;
    if (c.pool_mib) set_pool(static_cast<uint64_t>(*c.pool_mib) * kMiB);
    if (c.stream_share) policy_.stream_share = *c.stream_share;
    if (c.direct_share) policy_.direct_share = *c.direct_share;
    if (c.prefill_cpu_share) policy_.prefill_cpu_share = *c.prefill_cpu_share;
    if (c.profiler_new) policy_.profiler_new = *c.profiler_new;
    if (c.grouping) policy_.grouping = *c.grouping;
    ++policy_.changes;
    forwards_at_change_.push_back(forwards_.load());
    return {};
  }
  std::vector<model::LayerSplit> layer_split() const override {
    std::vector<model::LayerSplit> v = model::all_on_cpu(config().n_layer, config().n_expert);
    for (int64_t s = 0; s < policy_.pool_filled; ++s) {
      model::LayerSplit& l = v[static_cast<size_t>(s % config().n_layer)];
      ++l.vram;
      --l.cpu;
    }
    return v;
  }

  bool changed_during_forward() const { return changed_during_forward_; }
  int64_t forwards() const { return forwards_; }
  // forwards() at each applied change (scheduler thread; read once the engine has stopped).
  const std::vector<int64_t>& forwards_at_change() const { return forwards_at_change_; }

 private:
  void set_pool(uint64_t bytes) {
    policy_.pool_slots = static_cast<int64_t>(bytes / kSlotBytes);
    policy_.pool_bytes = static_cast<uint64_t>(policy_.pool_slots) * kSlotBytes;
    policy_.pool_filled = policy_.pool_slots;
  }

  model::ModelArch& inner_;
  model::ExpertPolicy policy_;
  std::atomic<bool> in_forward_{false};
  std::atomic<bool> changed_during_forward_{false};
  std::atomic<int64_t> forwards_{0};
  std::vector<int64_t> forwards_at_change_;
};

struct TinyModel {
  gguf::GgufFile file =
      gguf::GgufFile::open((testdata_dir() / "models/tiny-qwen3moe-sv-Q8_0.gguf").string());
  cpu::ThreadPool pool{2};
  std::unique_ptr<model::ModelArch> cpu = model::create_model_arch(file, pool, nullptr);
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(file);
};

engine::EngineOptions options() {
  engine::EngineOptions o;
  o.n_ctx = 256;
  return o;
}

std::shared_ptr<engine::Job> long_job(int64_t max_tokens) {
  engine::JobRequest r;
  r.prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return std::make_shared<engine::Job>(std::move(r));
}

// Waits for the job's end event; the generated token count.
int64_t wait_end(engine::Job& job) {
  for (;;) {
    const std::optional<engine::JobEvent> ev = job.wait_event(std::chrono::seconds(60));
    if (!ev) return -1;
    if (ev->kind == engine::JobEvent::Finish) return ev->completion_tokens;
    if (ev->kind == engine::JobEvent::Failed) return -1;
  }
}

TEST(ExpertPolicy, ValidationNamesTheFlag) {
  model::ExpertPolicyChange c;
  EXPECT_EQ(model::validate(c), "");
  c.stream_share = 1.5;
  EXPECT_NE(model::validate(c).find("--moe-stream-share must be between 0 and 1 or auto, got 1.5"),
            std::string::npos)
      << model::validate(c);
  c.stream_share = model::ExpertPolicy::kAutoShare;
  EXPECT_EQ(model::validate(c), "");
  c.direct_share = -0.5;
  EXPECT_NE(model::validate(c).find("--moe-direct-share"), std::string::npos);
  c.direct_share = std::nullopt;
  c.prefill_cpu_share = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(model::validate(c).find("--moe-prefill-cpu-share"), std::string::npos);
  c.prefill_cpu_share = 0;
  c.pool_mib = -1;
  EXPECT_NE(model::validate(c).find("--moe-resident-mib"), std::string::npos);
  c.pool_mib = model::kMaxPoolMib + 1;
  EXPECT_NE(model::validate(c).find("--moe-resident-mib"), std::string::npos);
  c.pool_mib = 0;
  EXPECT_EQ(model::validate(c), "");

  EXPECT_EQ(model::parse_share("auto"), model::ExpertPolicy::kAutoShare);
  EXPECT_EQ(model::parse_share("0.25"), 0.25);
  EXPECT_EQ(model::parse_share("1"), 1.0);
  for (const char* bad : {"", "1.01", "-0.1", "nan", "0.3x", "auto ", "inf"}) {
    EXPECT_FALSE(model::parse_share(bad)) << bad;
  }
  EXPECT_EQ(model::format_share(model::ExpertPolicy::kAutoShare), "auto");
  EXPECT_EQ(model::format_share(0.3), "0.3");
}

TEST(ExpertPolicy, ChangesLandBetweenForwardsWhileAGenerationRuns) {
  TinyModel m;
  PolicyModel model(*m.cpu);
  engine::Engine eng(model, m.tok, options());
  ASSERT_TRUE(eng.stats().policy);
  EXPECT_EQ(eng.stats().policy->pool_slots, 4);

  const engine::PolicyResult read = eng.expert_policy({});
  ASSERT_EQ(read.status, engine::PolicyResult::Ok) << read.message;
  ASSERT_TRUE(read.policy);
  EXPECT_EQ(read.policy->changes, 0u);
  ASSERT_EQ(read.layers.size(), static_cast<size_t>(m.cpu->config().n_layer));
  EXPECT_EQ(read.layers[0].vram + read.layers[0].cpu, m.cpu->config().n_expert);

  // While a long generation runs, the pool is resized again and again: each change is applied
  // between two forwards, and the generation is not disturbed.
  const auto job = long_job(240);
  ASSERT_EQ(eng.submit(job), engine::Engine::Admit::Ok);
  int applied = 0;
  for (int i = 0; i < 6; ++i) {
    model::ExpertPolicyChange c;
    c.pool_mib = i % 2 == 0 ? 24 : 6;
    const engine::PolicyResult r = eng.expert_policy(c);
    ASSERT_EQ(r.status, engine::PolicyResult::Ok) << r.message;
    EXPECT_EQ(r.policy->pool_slots, i % 2 == 0 ? 8 : 2);
    ++applied;
  }
  EXPECT_EQ(wait_end(*job), 240);

  // Refused: out of range (never reaches the model), and more than the VRAM left.
  model::ExpertPolicyChange bad;
  bad.stream_share = 2;
  engine::PolicyResult r = eng.expert_policy(bad);
  EXPECT_EQ(r.status, engine::PolicyResult::Invalid);
  EXPECT_NE(r.message.find("--moe-stream-share"), std::string::npos) << r.message;
  model::ExpertPolicyChange big;
  big.pool_mib = 65;
  big.grouping = true;
  r = eng.expert_policy(big);
  EXPECT_EQ(r.status, engine::PolicyResult::NoRoom);
  EXPECT_NE(r.message.find("65 MiB"), std::string::npos) << r.message;
  ASSERT_TRUE(r.policy);
  EXPECT_FALSE(r.policy->grouping);
  EXPECT_EQ(r.policy->changes, static_cast<uint64_t>(applied));
  EXPECT_EQ(eng.stats().policy->changes, static_cast<uint64_t>(applied));

  eng.stop();
  r = eng.expert_policy({});
  EXPECT_EQ(r.status, engine::PolicyResult::Unavailable);
  EXPECT_FALSE(model.changed_during_forward());
  // At least one change came after the generation's first forward and before its last.
  const std::vector<int64_t>& at = model.forwards_at_change();
  ASSERT_EQ(at.size(), static_cast<size_t>(applied));
  EXPECT_GT(at.back(), 0);
  EXPECT_LT(at.front(), model.forwards());
}

TEST(ExpertPolicy, TheCpuOnlyForwardHasNoneAndSaysWhy) {
  TinyModel m;
  engine::Engine eng(*m.cpu, m.tok, options());
  EXPECT_FALSE(eng.stats().policy);
  const engine::PolicyResult read = eng.expert_policy({});
  ASSERT_EQ(read.status, engine::PolicyResult::Ok);
  EXPECT_FALSE(read.policy);
  ASSERT_EQ(read.layers.size(), static_cast<size_t>(m.cpu->config().n_layer));
  for (const model::LayerSplit& l : read.layers) {
    EXPECT_FALSE(l.gpu_home);
    EXPECT_EQ(l.cpu, m.cpu->config().n_expert);
    EXPECT_EQ(l.vram + l.direct, 0);
  }
  model::ExpertPolicyChange c;
  c.stream_share = 0.5;
  const engine::PolicyResult r = eng.expert_policy(c);
  EXPECT_EQ(r.status, engine::PolicyResult::Unsupported);
  EXPECT_NE(r.message.find("-cmoe"), std::string::npos) << r.message;
}

// The Control service hosted in this process, over the engine of `model`.
struct ControlHarness {
  ControlHarness(model::ModelArch& model, const tokenizer::Tokenizer& tok)
      : eng(model, tok, options()) {
    state.engine = &eng;
    state.model_name = "tiny";
    grpc::ServerBuilder b;
    b.RegisterService(&service);
    server = b.BuildAndStart();
    stub = v1::Control::NewStub(server->InProcessChannel({}));
  }
  ~ControlHarness() {
    server->Shutdown();
    state.engine = nullptr;
    eng.stop();
  }
  engine::Engine eng;
  server::ServingState state;
  engine::WorkerRegistry registry;
  placement::Placement placement;
  server::GrpcAuth auth{"", "worker-secret"};
  server::ControlService service{state, registry, placement, auth, [] {}};
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Control::Stub> stub;
};

TEST(ExpertPolicy, ControlServiceMetricsAndCliShowTheChange) {
  TinyModel m;
  PolicyModel model(*m.cpu);
  ControlHarness h(model, m.tok);
  const auto call = [&](auto method, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return ((*h.stub).*method)(&ctx, req, resp);
  };

  v1::ExpertPolicyResponse got;
  grpc::Status st = call(&v1::Control::Stub::GetExpertPolicy, v1::GetExpertPolicyRequest(), &got);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(got.policy().pool_bytes(), 12 * kMiB);
  EXPECT_DOUBLE_EQ(got.policy().stream_share(), 0.3);

  v1::SetExpertPolicyRequest set;
  set.set_pool_mib(30);
  set.set_stream_share(-1);
  set.set_profiler_new(true);
  set.set_grouping(true);
  v1::ExpertPolicyResponse changed;
  st = call(&v1::Control::Stub::SetExpertPolicy, set, &changed);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(changed.policy().pool_slots(), 10);
  EXPECT_EQ(changed.policy().stream_share(), -1);
  EXPECT_TRUE(changed.policy().profiler_new());
  EXPECT_TRUE(changed.policy().grouping());
  EXPECT_DOUBLE_EQ(changed.policy().direct_share(), -1);  // not set: unchanged
  EXPECT_EQ(changed.policy().changes(), 1u);

  // Errors: nothing set, a share out of range, a pool the VRAM cannot hold.
  v1::ExpertPolicyResponse ignored;
  st = call(&v1::Control::Stub::SetExpertPolicy, v1::SetExpertPolicyRequest(), &ignored);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::SetExpertPolicyRequest bad;
  bad.set_direct_share(1.5);
  st = call(&v1::Control::Stub::SetExpertPolicy, bad, &ignored);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("--moe-direct-share"), std::string::npos);
  v1::SetExpertPolicyRequest big;
  big.set_pool_mib(1024);
  st = call(&v1::Control::Stub::SetExpertPolicy, big, &ignored);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  v1::ExpertPolicyResponse recal;
  st = call(&v1::Control::Stub::Recalibrate, v1::RecalibrateRequest(), &recal);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_DOUBLE_EQ(recal.policy().recalibrated_ms(), 12.5);
  EXPECT_EQ(recal.policy().changes(), 2u);

  v1::GetPlacementResponse placement;
  st = call(&v1::Control::Stub::GetPlacement, v1::GetPlacementRequest(), &placement);
  ASSERT_TRUE(st.ok()) << st.error_message();
  const model::ModelConfig& cfg = m.cpu->config();
  ASSERT_EQ(placement.layers_size(), cfg.n_layer);
  int64_t in_vram = 0;
  for (const v1::LayerPlacement& l : placement.layers()) {
    EXPECT_EQ(l.vram() + l.direct() + l.cpu(), cfg.n_expert);
    in_vram += l.vram();
  }
  EXPECT_EQ(in_vram, 10);

  http::Metrics metrics;
  const std::string text = metrics.scrape(h.state, h.registry);
  EXPECT_NE(text.find("moe_expert_policy{setting=\"stream_share\"} -1"), std::string::npos) << text;
  EXPECT_NE(text.find("moe_expert_policy{setting=\"pool_slots\"} 10"), std::string::npos);
  EXPECT_NE(text.find("moe_expert_policy{setting=\"grouping\"} 1"), std::string::npos);
  EXPECT_NE(text.find("moe_expert_policy_changes_total 2"), std::string::npos);

  const std::string table = cli::format_policy(recal, placement);
  EXPECT_NE(table.find("pool:              30 MiB, 10 of 10 slots filled (3.0 MiB each; up to "
                       "64 MiB)"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("stream share:      auto"), std::string::npos);
  EXPECT_NE(table.find("profiler:          new"), std::string::npos);
  EXPECT_NE(table.find("grouping:          layout"), std::string::npos);
  EXPECT_NE(table.find("LAYER  HOME  VRAM  DIRECT  CPU"), std::string::npos) << table;
  const std::string json = cli::format_policy_json(recal, placement);
  EXPECT_NE(json.find("\"stream_share\":-1"), std::string::npos) << json;
  EXPECT_NE(json.find("\"layers\":[{"), std::string::npos);
}

TEST(ExpertPolicy, ControlServiceRefusesWithoutAGpuForward) {
  TinyModel m;
  ControlHarness h(*m.cpu, m.tok);
  grpc::ClientContext ctx;
  v1::ExpertPolicyResponse resp;
  const grpc::Status st = h.stub->GetExpertPolicy(&ctx, v1::GetExpertPolicyRequest(), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("CPU"), std::string::npos) << st.error_message();
  http::Metrics metrics;
  EXPECT_EQ(metrics.scrape(h.state, h.registry).find("moe_expert_policy{"), std::string::npos);
}

}  // namespace
}  // namespace moe::test
