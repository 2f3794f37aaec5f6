#include "coordinator/residency/expert_policy.h"

#include <cmath>

namespace moe::model {

namespace {

bool share_ok(double s) {
  return s == ExpertPolicy::kAutoShare || (std::isfinite(s) && s >= 0 && s <= 1);
}

std::string share_error(const char* flag, double s) {
  return std::string(flag) + " must be between 0 and 1 or auto, got " + format_share(s);
}

}  // namespace

std::string validate(const ExpertPolicyChange& c) {
  if (c.pool_mib && (*c.pool_mib < 0 || *c.pool_mib > kMaxPoolMib)) {
    return "--moe-resident-mib must be between 0 and " + std::to_string(kMaxPoolMib) + ", got " +
           std::to_string(*c.pool_mib);
  }
  if (c.stream_share && !share_ok(*c.stream_share)) {
    return share_error("--moe-stream-share", *c.stream_share);
  }
  if (c.direct_share && !share_ok(*c.direct_share)) {
    return share_error("--moe-direct-share", *c.direct_share);
  }
  if (c.prefill_cpu_share && !share_ok(*c.prefill_cpu_share)) {
    return share_error("--moe-prefill-cpu-share", *c.prefill_cpu_share);
  }
  return {};
}

std::vector<LayerSplit> all_on_cpu(int64_t n_layer, int64_t n_expert) {
  std::vector<LayerSplit> v;
  if (n_expert <= 0) return v;
  for (int64_t l = 0; l < n_layer; ++l) v.push_back({l, false, 0, 0, n_expert});
  return v;
}

}  // namespace moe::model
