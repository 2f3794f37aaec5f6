// Errors raised while lexing, parsing or rendering a template. They carry the byte offset of the
// construct that failed; ChatTemplate turns that into "chat template line L, column C: ...".
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace moe::jinja {

inline constexpr size_t kNoPos = static_cast<size_t>(-1);

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg, size_t pos = kNoPos)
      : std::runtime_error(msg), pos_(pos) {}
  size_t pos() const { return pos_; }
  // Builtins throw without a position; the interpreter adds the position of the innermost
  // expression being evaluated as the error propagates.
  void set_pos_if_unset(size_t pos) {
    if (pos_ == kNoPos) pos_ = pos;
  }
  // raise_exception(): the message is the template author's, reported as is.
  bool user_raised = false;

 private:
  size_t pos_;
};

[[noreturn]] inline void fail(const std::string& msg, size_t pos = kNoPos) {
  throw Error(msg, pos);
}

}  // namespace moe::jinja
