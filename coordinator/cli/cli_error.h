// The two ways a moe-cli command fails besides an interrupt: the server answered with a non-OK
// status (exit status 1) or the client found its own input wrong before calling (exit status 2,
// CLI11's convention for usage errors). main() prints either as "moe-cli: <what()>".
#pragma once

#include <grpcpp/support/status.h>

#include <string>
#include <string_view>

#include "common/error.h"

namespace moe::cli {

// A non-OK status of an RPC; what() is "<CODE_NAME>: <message>", e.g. "UNAVAILABLE: CPU worker
// died" (just the code name when the message is empty).
class RpcError : public moe::Error {
 public:
  explicit RpcError(const grpc::Status& status);
  grpc::StatusCode code() const { return code_; }

 private:
  grpc::StatusCode code_;
};

// Input the client owns and found wrong: a --tokens list, a --messages file.
class UsageError : public moe::Error {
 public:
  using moe::Error::Error;
};

// The canonical name of a status code: "OK", "CANCELLED", ..., "UNAUTHENTICATED"; "CODE_<n>" for a
// value outside the enum.
std::string status_code_name(grpc::StatusCode code);

// Throws RpcError unless `status` is OK.
void check(const grpc::Status& status);

}  // namespace moe::cli
