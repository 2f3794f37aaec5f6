// How often each routed expert of each layer was chosen, saved to a file (--moe-profile FILE)
// so that the next start fills the VRAM pool with the hot experts before the first token instead
// of learning them again. JSON, written atomically (a temporary file renamed over the old one);
// bound to the model's shape (architecture, layers, experts), so a profile of another model is
// refused with a message instead of filling the pool with the wrong experts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moe::model {

struct RoutingProfile {
  std::string arch;
  int64_t n_layer = 0;
  int64_t n_expert = 0;
  std::vector<uint64_t> counts;  // [n_layer * n_expert], layer-major

  // nullopt when `path` does not exist (the first run creates it); moe::Error naming the file
  // when it cannot be read or is not a profile (bad JSON, wrong format or version, counts that do
  // not match the shape or are not non-negative integers).
  static std::optional<RoutingProfile> load(const std::string& path);
  // Throws moe::Error naming the file when it cannot be written.
  void save(const std::string& path) const;
  // moe::Error unless this profile was recorded for a model of this shape.
  void check_matches(const std::string& arch, int64_t n_layer, int64_t n_expert,
                     const std::string& path) const;
};

}  // namespace moe::model
