// grpc.health.v1 whose answer is earned: Check runs a real one-token forward through the engine
// (and so through the expert workers, restarting a dead one) instead of reporting a flag.
#pragma once

#include "coordinator/server/serving_state.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace moe::server {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  explicit HealthService(ServingState& state) : state_(state) {}

  grpc::Status Check(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                     grpc::health::v1::HealthCheckResponse* resp) override;
  // Sends the status now and whenever it changes (probed every second) until the client leaves.
  grpc::Status Watch(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

 private:
  // SERVING or NOT_SERVING (with the reason logged), SERVICE_UNKNOWN for a service we lack.
  grpc::health::v1::HealthCheckResponse::ServingStatus status(const std::string& service,
                                                              grpc::ServerContext* ctx);
  ServingState& state_;
};

}  // namespace moe::server
