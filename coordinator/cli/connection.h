// The channel to the coordinator and the deadline every call carries (--addr, --timeout).
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace moe::cli {

struct ConnectionOptions {
  std::string addr = "127.0.0.1:50051";  // HOST:PORT or any gRPC target
  double timeout_s = 600;                // deadline of each call (of each turn in chat)
};

class Connection {
 public:
  // Creates the (insecure) channel; it connects lazily, at the first call. `reconnect_backoff`:
  // how long the channel waits before reconnecting after a failed attempt (gRPC's default grows
  // from 1 s to 120 s).
  explicit Connection(const ConnectionOptions& options,
                      std::optional<std::chrono::milliseconds> reconnect_backoff = std::nullopt);

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // --timeout as a duration.
  std::chrono::system_clock::duration timeout() const { return timeout_; }
  // Sets the deadline of a call starting now: now + --timeout.
  void set_deadline(grpc::ClientContext& ctx) const;

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::chrono::system_clock::duration timeout_;
};

}  // namespace moe::cli
