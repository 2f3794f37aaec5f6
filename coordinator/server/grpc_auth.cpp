#include "coordinator/server/grpc_auth.h"

#include <sys/random.h>

#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "common/error.h"

namespace moe::server {

namespace {

// The time taken does not depend on where the strings differ (only on their lengths).
bool equal_constant_time(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The first value of `key` in the call's metadata, or nullptr.
const grpc::string_ref* metadata(const grpc::ServerContext& ctx, const char* key) {
  const auto& md = ctx.client_metadata();
  const auto it = md.find(key);
  return it == md.end() ? nullptr : &it->second;
}

}  // namespace

GrpcAuth::GrpcAuth(std::string api_key, std::string worker_secret)
    : api_key_(std::move(api_key)), worker_secret_(std::move(worker_secret)) {
  if (worker_secret_.empty()) throw std::logic_error("GrpcAuth: empty worker secret");
}

grpc::Status GrpcAuth::client(const grpc::ServerContext& ctx) const {
  if (api_key_.empty()) return grpc::Status::OK;
  const grpc::string_ref* auth = metadata(ctx, "authorization");
  if (auth == nullptr) {
    return {grpc::StatusCode::UNAUTHENTICATED,
            "missing API key (metadata 'authorization: Bearer KEY')"};
  }
  const std::string_view got(auth->data(), auth->size());
  const std::string_view prefix = "Bearer ";
  if (got.substr(0, prefix.size()) != prefix ||
      !equal_constant_time(got.substr(prefix.size()), api_key_)) {
    return {grpc::StatusCode::UNAUTHENTICATED, "invalid API key"};
  }
  return grpc::Status::OK;
}

grpc::Status GrpcAuth::worker(const grpc::ServerContext& ctx) const {
  const grpc::string_ref* secret = metadata(ctx, kWorkerSecretMetadata);
  if (secret == nullptr ||
      !equal_constant_time(std::string_view(secret->data(), secret->size()), worker_secret_)) {
    return {grpc::StatusCode::UNAUTHENTICATED,
            "only this coordinator's own workers may call this method"};
  }
  return grpc::Status::OK;
}

std::string make_worker_secret() {
  uint8_t bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n <= 0) throw Error("cannot read random bytes for the worker secret");
    got += static_cast<size_t>(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

}  // namespace moe::server
