// How moe-cli writes: text to stdout byte for byte as it arrives (flushed at once), bytes escaped
// for display, protobuf messages as one-line JSON.
#pragma once

#include <google/protobuf/message.h>

#include <string>
#include <string_view>

namespace moe::cli {

// Text on stdout, remembering whether the last byte written ended a line.
class TextOut {
 public:
  // Writes `bytes` unchanged and flushes.
  void write(std::string_view bytes);
  // Writes a newline unless nothing was written or the output already ends with one.
  void end_line();
  // end_line() only when stdout is a terminal: keeps the shell prompt (and the stderr summary)
  // off the text while piped output stays exactly what the server sent.
  void end_line_if_tty();

 private:
  bool at_line_start_ = true;
};

// The concatenation of `parts` (std::string, string_view, const char* or char), built by
// appending. Used instead of "literal" + std::string temporaries, for which GCC 12 at -O3 reports
// a false -Wrestrict (GCC bug 105329).
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  ((s += parts), ...);
  return s;
}

// `bytes` for display on one line: printable ASCII and valid UTF-8 characters as they are,
// backslash as "\\", every other byte (controls, DEL, C1 controls, bytes of incomplete or invalid
// UTF-8 sequences) as "\xNN".
std::string escape_bytes(std::string_view bytes);

// The proto3 JSON form of `message` on one line, with the .proto field names (snake_case), fields
// at their default values included and enums by name. Throws moe::Error if it cannot be converted.
std::string to_json(const google::protobuf::Message& message);

}  // namespace moe::cli
