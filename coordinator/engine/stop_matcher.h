// Stop strings over streamed text: text is released only once it cannot be the start of a stop
// string, so a client never sees part of a stop string (llama-server's behaviour).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moe::engine {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Step {
    std::string release;              // text safe to send now
    std::optional<std::string> stop;  // the stop string that matched: generation ends
  };

  // Appends new text. On a match, `release` is the text before the stop string and the rest is
  // dropped.
  Step push(std::string_view text);
  // The held-back tail, at the end of generation.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace moe::engine
