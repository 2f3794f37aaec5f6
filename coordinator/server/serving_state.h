// What the services share: the engine once the coordinator is up (null while starting and again
// while stopping, when calls are answered UNAVAILABLE) and the model's limits.
#pragma once

#include <atomic>
#include <string>

#include "coordinator/engine/engine.h"
#include "coordinator/engine/layer_stats.h"
#include "coordinator/server/request_validation.h"

namespace moe::server {

struct ServingState {
  std::atomic<engine::Engine*> engine{nullptr};
  std::atomic<int> active_streams{0};  // Generate calls not yet returned
  ModelLimits limits;                  // valid once engine is set
  std::string model_name;
  std::string kv_cache;  // KvCache::describe(): types by layer, rotation, bytes
  const engine::LayerStats* layers = nullptr;  // per-layer expert work; valid once engine is set
};

}  // namespace moe::server
