#include "cpu_worker/coordinator_link.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdlib>

#include "common/error.h"
#include "common/worker_secret.h"
#include "moe/v1/control.grpc.pb.h"

namespace moe::worker {

namespace {

// A coordinator that has not answered for this long is gone even if its pid still exists (hung).
constexpr std::chrono::seconds kSilenceLimit{10};

std::chrono::system_clock::time_point deadline_in(std::chrono::milliseconds d) {
  return std::chrono::system_clock::now() + d;
}

// The secret our coordinator gave us at spawn; the worker-only calls are refused without it.
void add_secret(grpc::ClientContext& ctx, const std::string& secret) {
  if (!secret.empty()) ctx.AddMetadata(kWorkerSecretMetadata, secret);
}

}  // namespace

struct CoordinatorLink::Stub {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Control::Stub> control;
};

CoordinatorLink::CoordinatorLink(const std::string& addr, const WorkerIdentity& me,
                                 std::chrono::milliseconds timeout)
    : stub_(std::make_unique<Stub>()), me_(me) {
  if (const char* s = std::getenv(kWorkerSecretEnv)) secret_ = s;
  stub_->channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  stub_->control = v1::Control::NewStub(stub_->channel);
  v1::RegisterRequest req;
  req.set_worker_id(me.worker_id);
  req.set_kind(v1::WORKER_KIND_CPU);
  req.set_pid(static_cast<int32_t>(::getpid()));
  req.set_numa_node(me.numa_node);
  for (int c : me.cpus) req.add_cpus(c);
  req.set_threads(me.threads);
  req.set_segment(me.segment);
  req.set_isa(me.isa);
  // wait_for_ready: the coordinator's server may still be starting; the deadline bounds it.
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline_in(timeout));
  ctx.set_wait_for_ready(true);
  add_secret(ctx, secret_);
  v1::RegisterResponse resp;
  const grpc::Status st = stub_->control->Register(&ctx, req, &resp);
  if (!st.ok()) {
    throw Error("registration with the coordinator at " + addr + " failed: " + st.error_message());
  }
  if (resp.heartbeat_interval_ms() > 0) {
    interval_ = std::chrono::milliseconds(resp.heartbeat_interval_ms());
  }
}

CoordinatorLink::~CoordinatorLink() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CoordinatorLink::start_heartbeats(std::function<WorkStats()> stats) {
  thread_ = std::thread([this, stats = std::move(stats)] { heartbeat_loop(stats); });
}

std::string CoordinatorLink::exit_reason() const {
  std::lock_guard lock(mu_);
  return reason_;
}

void CoordinatorLink::heartbeat_loop(std::function<WorkStats()> stats) {
  auto last_answer = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, interval_, [&] { return stop_; })) return;
    }
    const WorkStats s = stats();
    v1::HeartbeatRequest req;
    req.set_worker_id(me_.worker_id);
    req.set_pid(static_cast<int32_t>(::getpid()));
    req.set_requests_served(s.requests_served);
    req.set_busy_ms(s.busy_ms);
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline_in(std::chrono::milliseconds(1000)));
    add_secret(ctx, secret_);
    v1::HeartbeatResponse resp;
    const grpc::Status st = stub_->control->Heartbeat(&ctx, req, &resp);
    std::string why;
    if (st.ok()) {
      last_answer = std::chrono::steady_clock::now();
      if (resp.command() == v1::WORKER_COMMAND_EXIT) why = "the coordinator told us to exit";
    } else if (std::chrono::steady_clock::now() - last_answer > kSilenceLimit) {
      why = "the coordinator has not answered heartbeats for " +
            std::to_string(kSilenceLimit.count()) + " s (" + st.error_message() + ")";
    }
    if (!why.empty()) {
      {
        std::lock_guard lock(mu_);
        reason_ = why;
      }
      exit_.store(true, std::memory_order_relaxed);
      return;
    }
  }
}

}  // namespace moe::worker
