#include "coordinator/cli/connection.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

namespace moe::cli {

Connection::Connection(const ConnectionOptions& options,
                       std::optional<std::chrono::milliseconds> reconnect_backoff)
    : timeout_(std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::duration<double>(options.timeout_s))),
      api_key_(options.api_key) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // a long tokenization or rendered prompt is not an error
  if (reconnect_backoff) {
    const int ms = static_cast<int>(reconnect_backoff->count());
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ms);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ms);
  }
  channel_ = grpc::CreateCustomChannel(options.addr, grpc::InsecureChannelCredentials(), args);
}

void Connection::prepare(grpc::ClientContext& ctx) const {
  ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
  authorize(ctx);
}

void Connection::authorize(grpc::ClientContext& ctx) const {
  if (!api_key_.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key_);
}

}  // namespace moe::cli
