// How a coordinator's own worker processes prove they are its own when they call the worker-only
// gRPC methods: a per-run secret, handed over in the environment at spawn, sent as call metadata.
#pragma once

namespace moe {

inline constexpr const char* kWorkerSecretEnv = "MOE_WORKER_SECRET";
inline constexpr const char* kWorkerSecretMetadata = "x-moe-worker-secret";

}  // namespace moe
