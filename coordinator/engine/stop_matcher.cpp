#include "coordinator/engine/stop_matcher.h"

#include <algorithm>

namespace moe::engine {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

StopMatcher::Step StopMatcher::push(std::string_view text) {
  held_.append(text);
  Step step;
  // The earliest match wins, so the output is the longest text without any stop string.
  size_t best = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at < best) {
      best = at;
      step.stop = s;
    }
  }
  if (step.stop) {
    step.release = held_.substr(0, best);
    held_.clear();
    return step;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len) {
      if (std::string_view(held_).substr(held_.size() - len) ==
          std::string_view(s).substr(0, len)) {
        keep = len;
        break;
      }
    }
  }
  step.release = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return step;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace moe::engine
