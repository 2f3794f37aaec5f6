// The channel to the coordinator, and the deadline and API key every call carries (--addr,
// --timeout, --api-key or MOE_API_KEY).
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
  std::string api_key;                   // sent as "authorization: Bearer KEY" when not empty
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
  // Sets the deadline of a call starting now (now + --timeout) and its API key.
  void prepare(grpc::ClientContext& ctx) const;
  // Only the API key (for calls that set a deadline of their own).
  void authorize(grpc::ClientContext& ctx) const;

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::chrono::system_clock::duration timeout_;
  std::string api_key_;
};

}  // namespace moe::cli
