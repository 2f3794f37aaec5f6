#include "coordinator/server/health_service.h"

#include <algorithm>
#include <cstdio>
#include <thread>

namespace moe::server {

namespace {

using grpc::health::v1::HealthCheckResponse;

constexpr std::chrono::milliseconds kMaxProbeWait{10000};

bool known_service(const std::string& s) {
  return s.empty() || s == "moe.v1.Generation" || s == "moe.v1.Control";
}

}  // namespace

HealthCheckResponse::ServingStatus HealthService::status(const std::string& service,
                                                         grpc::ServerContext* ctx) {
  if (!known_service(service)) return HealthCheckResponse::SERVICE_UNKNOWN;
  engine::Engine* eng = state_.engine.load();
  if (eng == nullptr) return HealthCheckResponse::NOT_SERVING;
  // Within the caller's deadline, leaving it time to receive the answer.
  auto wait = kMaxProbeWait;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      ctx->deadline() - std::chrono::system_clock::now());
  if (left < wait) wait = std::max(std::chrono::milliseconds(1), left * 9 / 10);
  const std::string why = eng->probe(wait);
  if (why.empty()) return HealthCheckResponse::SERVING;
  std::fprintf(stderr, "moe-coordinator: health check failed: %s\n", why.c_str());
  return HealthCheckResponse::NOT_SERVING;
}

grpc::Status HealthService::Check(grpc::ServerContext* ctx,
                                  const grpc::health::v1::HealthCheckRequest* req,
                                  HealthCheckResponse* resp) {
  const auto st = status(req->service(), ctx);
  if (st == HealthCheckResponse::SERVICE_UNKNOWN) {
    return {grpc::StatusCode::NOT_FOUND, "unknown service '" + req->service() + "'"};
  }
  resp->set_status(st);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(grpc::ServerContext* ctx,
                                  const grpc::health::v1::HealthCheckRequest* req,
                                  grpc::ServerWriter<HealthCheckResponse>* writer) {
  bool first = true;
  HealthCheckResponse::ServingStatus last = HealthCheckResponse::UNKNOWN;
  while (!ctx->IsCancelled()) {
    const auto st = status(req->service(), ctx);
    if (first || st != last) {
      HealthCheckResponse resp;
      resp.set_status(st);
      if (!writer->Write(resp)) break;
      first = false;
      last = st;
    }
    for (int i = 0; i < 50 && !ctx->IsCancelled(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return grpc::Status::OK;
}

}  // namespace moe::server
