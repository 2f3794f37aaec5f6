// Who may call which gRPC method. Clients (Generate, Tokenize, the Control calls people use) need
// the API key when one is set, as "authorization: Bearer KEY" metadata, like the HTTP API; the
// worker-only calls (Register, Heartbeat) need the per-run secret the coordinator hands its own
// workers at spawn, so nothing else that can connect can pose as a worker. Each service checks at
// the top of every method; tests call every method of every service without credentials.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <string>

#include "common/worker_secret.h"

namespace moe::server {

class GrpcAuth {
 public:
  // An empty api_key lets every client call; worker_secret must not be empty.
  GrpcAuth(std::string api_key, std::string worker_secret);

  // OK, or UNAUTHENTICATED naming what is missing or wrong.
  grpc::Status client(const grpc::ServerContext& ctx) const;
  grpc::Status worker(const grpc::ServerContext& ctx) const;

  const std::string& worker_secret() const { return worker_secret_; }

 private:
  std::string api_key_, worker_secret_;
};

// 32 random bytes from the kernel, as hex.
std::string make_worker_secret();

}  // namespace moe::server
