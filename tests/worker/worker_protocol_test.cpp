// The worker's side of the protocol, driven by hand over the rings: every out-of-range field is
// answered with an error status and a message naming it, the worker keeps serving, valid requests
// give the in-process result, and SHUTDOWN ends it with status 0.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "common/child_process.h"
#include "common/shm/futex.h"
#include "common/shm/shm_segment.h"
#include "experts/cpu_expert_executor.h"
#include "experts/expert_protocol.h"
#include "kernels/cpu/cpu_features.h"
#include "tests/worker/worker_test_util.h"

namespace {

using namespace moe::shm;
using moe::GgmlType;
using moe::model::ChildProcess;
using moe::model::ExpertItem;

class WorkerProtocol : public ::testing::Test {
 protected:
  static constexpr int64_t kMaxTokens = 4, kMaxItems = 8;

  void SetUp() override {
    path_ = moe::test::synth_model(GgmlType::F32);
    file_.emplace(moe::gguf::GgufFile::open(path_));
    cfg_ = moe::model::ModelConfig::from_gguf(*file_);
    const ExpertDims dims{cfg_.n_embd, kMaxTokens, kMaxItems};
    seg_.emplace(
        ShmSegment::create(run_segment_name("protocol"), expert_segment_layout(dims).total));
    view_.emplace(format_expert_segment(seg_->data(), seg_->size(), dims));
    worker_ = ChildProcess::spawn({moe::test::kWorkerBin, "--model", path_, "--segment",
                                   seg_->name(), "--coordinator-pid", std::to_string(::getpid()),
                                   "--threads", std::to_string(moe::test::kThreads)});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (view_->header->worker_ready.load() == 0) {
      ASSERT_TRUE(worker_.running()) << worker_.describe();
      ASSERT_LT(std::chrono::steady_clock::now(), deadline);
      futex_wait(view_->header->worker_ready, 0, std::chrono::milliseconds(10));
    }
    EXPECT_EQ(view_->header->worker_pid, worker_.pid());
    requests_.emplace(view_->requests);
    responses_.emplace(view_->responses);
  }

  ExpertResponse call(int32_t layer, int32_t n_tokens, const std::vector<ExpertWorkItem>& items,
                      uint32_t kind = static_cast<uint32_t>(ExpertRequestKind::Run)) {
    if (!items.empty()) {
      std::memcpy(view_->items, items.data(), items.size() * sizeof(ExpertWorkItem));
    }
    const ExpertRequest req{++seq_, layer, n_tokens, static_cast<int32_t>(items.size()), kind};
    WaitOptions opt;
    opt.timeout = std::chrono::seconds(30);
    opt.peer_alive = [this] { return worker_.running(); };
    ExpertResponse resp{};
    EXPECT_EQ(requests_->push(&req, sizeof req, opt), WaitStatus::Ok);
    EXPECT_EQ(responses_->pop(&resp, sizeof resp, opt), WaitStatus::Ok) << worker_.describe();
    EXPECT_EQ(resp.seq, req.seq);
    return resp;
  }

  // An error answer naming `what`.
  void expect_rejected(int32_t layer, int32_t n_tokens, const std::vector<ExpertWorkItem>& items,
                       const std::string& what, uint32_t kind = 1) {
    const ExpertResponse r = call(layer, n_tokens, items, kind);
    EXPECT_EQ(r.status, static_cast<int32_t>(ExpertStatus::BadRequest));
    const std::string msg(r.message, strnlen(r.message, sizeof r.message));
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }

  // A valid request answers the in-process result, bit for bit.
  void expect_served(int32_t layer) {
    const int64_t E = cfg_.n_embd, n = 3;
    std::mt19937 rng(static_cast<uint32_t>(seq_));
    std::uniform_real_distribution<float> val(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n * E));
    for (float& v : x) v = val(rng);
    const std::vector<ExpertWorkItem> items = {{2, 5, 0.25f}, {0, 1, 0.5f}, {2, 0, 0.75f}};
    std::memcpy(view_->x, x.data(), x.size() * sizeof(float));
    const ExpertResponse r = call(layer, static_cast<int32_t>(n), items);
    ASSERT_EQ(r.status, 0) << r.message;

    moe::cpu::ThreadPool pool(moe::test::kThreads);
    std::vector<moe::model::ExpertLayerTensors> layers;
    for (int64_t l = 0; l < cfg_.n_layer; ++l) {
      layers.push_back(
          moe::model::require_expert_tensors(*file_, l, E, cfg_.n_ff_exp, cfg_.n_expert));
    }
    moe::model::CpuExpertExecutor local(layers, E, cfg_.n_ff_exp, cfg_.n_expert, pool,
                                        moe::cpu::best_isa());
    std::vector<ExpertItem> local_items;
    for (const ExpertWorkItem& w : items) local_items.push_back({w.token, w.expert, w.weight});
    std::vector<float> want(x.size());
    local.run(layer, x.data(), n, local_items, want.data());
    EXPECT_EQ(std::memcmp(want.data(), view_->out, want.size() * sizeof(float)), 0);
    EXPECT_EQ(view_->out[E], 0.0f);  // token 1 has no items
  }

  std::string path_;
  std::optional<moe::gguf::GgufFile> file_;
  moe::model::ModelConfig cfg_;
  std::optional<ShmSegment> seg_;
  std::optional<ExpertSegment> view_;
  ChildProcess worker_;
  std::optional<RingProducer> requests_;
  std::optional<RingConsumer> responses_;
  uint64_t seq_ = 0;
};

TEST_F(WorkerProtocol, RejectsBadRequestsAndKeepsServing) {
  const int32_t L = static_cast<int32_t>(cfg_.n_layer), X = static_cast<int32_t>(cfg_.n_expert);
  const std::vector<ExpertWorkItem> one = {{0, 1, 1.0f}};
  expect_served(0);
  expect_rejected(L, 1, one, "layer 2 not in [0, 2)");
  expect_rejected(-1, 1, one, "layer -1");
  expect_rejected(0, kMaxTokens + 1, one, "n_tokens 5 not in [0, 5)");
  expect_rejected(0, -3, one, "n_tokens -3");
  expect_served(1);
  expect_rejected(0, 1, {{0, X, 1.0f}}, "item 0: expert 6 not in [0, 6)");
  expect_rejected(0, 1, {{0, 1, 1.0f}, {0, -1, 1.0f}}, "item 1: expert -1");
  expect_rejected(0, 2, {{2, 1, 1.0f}}, "item 0: token 2 not in [0, 2)");
  expect_rejected(0, 1, {{0, 1, NAN}}, "item 0: weight is not finite");
  expect_rejected(0, 1, {{0, 1, INFINITY}}, "weight is not finite");
  expect_rejected(0, 1, one, "unknown request kind 7", 7);
  expect_served(0);
  // n_items beyond the items area: the count alone is rejected, nothing is read.
  const ExpertRequest big{++seq_, 0, 1, static_cast<int32_t>(kMaxItems + 1),
                          static_cast<uint32_t>(ExpertRequestKind::Run)};
  WaitOptions opt;
  opt.timeout = std::chrono::seconds(30);
  ASSERT_EQ(requests_->push(&big, sizeof big, opt), WaitStatus::Ok);
  ExpertResponse r{};
  ASSERT_EQ(responses_->pop(&r, sizeof r, opt), WaitStatus::Ok);
  EXPECT_EQ(r.status, static_cast<int32_t>(ExpertStatus::BadRequest));
  EXPECT_NE(std::string(r.message).find("n_items 9 not in [0, 9)"), std::string::npos) << r.message;
  expect_served(1);

  const ExpertRequest stop{++seq_, 0, 0, 0, static_cast<uint32_t>(ExpertRequestKind::Shutdown)};
  ASSERT_EQ(requests_->push(&stop, sizeof stop, opt), WaitStatus::Ok);
  ASSERT_TRUE(worker_.wait_for(std::chrono::seconds(2)));
  EXPECT_EQ(worker_.exit_code(), 0) << worker_.describe();
}

}  // namespace
