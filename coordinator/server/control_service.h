// moe.v1.Control: worker registration and heartbeats (into the WorkerRegistry), statistics, the
// effective placement, the routed experts' live policy (through the engine, between steps),
// draining and shutdown (which it asks the coordinator's main loop to do).
#pragma once

#include <functional>

#include "common/placement/placement.h"
#include "coordinator/engine/worker_registry.h"
#include "coordinator/server/grpc_auth.h"
#include "coordinator/server/serving_state.h"
#include "moe/v1/control.grpc.pb.h"

namespace moe::server {

class ControlService final : public v1::Control::Service {
 public:
  // `request_shutdown` is called (once per Shutdown RPC) after the drain. Register and Heartbeat
  // need auth.worker(), every other method auth.client().
  ControlService(ServingState& state, engine::WorkerRegistry& registry,
                 const placement::Placement& placement, const GrpcAuth& auth,
                 std::function<void()> request_shutdown);

  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::Status GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest* req,
                        v1::GetStatsResponse* resp) override;
  grpc::Status GetPlacement(grpc::ServerContext* ctx, const v1::GetPlacementRequest* req,
                            v1::GetPlacementResponse* resp) override;
  grpc::Status GetExpertPolicy(grpc::ServerContext* ctx, const v1::GetExpertPolicyRequest* req,
                               v1::ExpertPolicyResponse* resp) override;
  grpc::Status SetExpertPolicy(grpc::ServerContext* ctx, const v1::SetExpertPolicyRequest* req,
                               v1::ExpertPolicyResponse* resp) override;
  grpc::Status Recalibrate(grpc::ServerContext* ctx, const v1::RecalibrateRequest* req,
                           v1::ExpertPolicyResponse* resp) override;
  grpc::Status Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req,
                     v1::DrainResponse* resp) override;
  grpc::Status Shutdown(grpc::ServerContext* ctx, const v1::ShutdownRequest* req,
                        v1::ShutdownResponse* resp) override;

  static constexpr uint32_t kHeartbeatIntervalMs = 500;

 private:
  // The policy change (or read, when empty) through the engine, answered into resp.
  grpc::Status policy(const model::ExpertPolicyChange& change, v1::ExpertPolicyResponse* resp);

  ServingState& state_;
  engine::WorkerRegistry& registry_;
  const placement::Placement& placement_;
  const GrpcAuth& auth_;
  std::function<void()> request_shutdown_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

}  // namespace moe::server
