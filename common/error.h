// Error type shared by every component: bad input is reported with a message, never an abort.
#pragma once

#include <stdexcept>
#include <string>

namespace moe {

// Thrown for invalid input (corrupt files, bad arguments, unsupported types). The message is meant
// for the user: it names the file, tensor or key and says what is wrong.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace moe
