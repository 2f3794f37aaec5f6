#include "coordinator/cli/output.h"

#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "common/error.h"

namespace moe::cli {

namespace {

// Length of the valid UTF-8 sequence of at least two bytes that starts `s`, or 0 (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF). C1 controls (U+0080..U+009F) count as
// invalid so that they are escaped.
size_t utf8_sequence(std::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(0);
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
    if (b0 == 0xC2) lo = 0xA0;  // skip the C1 controls
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n || byte(1) < lo || byte(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i)
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  return n;
}

}  // namespace

void TextOut::write(std::string_view bytes) {
  if (bytes.empty()) return;
  std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  std::fflush(stdout);
  at_line_start_ = bytes.back() == '\n';
}

void TextOut::end_line() {
  if (!at_line_start_) write("\n");
}

void TextOut::end_line_if_tty() {
  if (isatty(STDOUT_FILENO)) end_line();
}

std::string escape_bytes(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    if (b == '\\') {
      out += "\\\\";
      ++i;
    } else if (b >= 0x20 && b < 0x7F) {
      out += static_cast<char>(b);
      ++i;
    } else if (const size_t n = b >= 0x80 ? utf8_sequence(bytes.substr(i)) : 0; n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 0xF];
      ++i;
    }
  }
  return out;
}

std::string to_json(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    throw moe::Error(cat("cannot write ", message.GetTypeName(), " as JSON: ", status.ToString()));
  }
  return out;
}

}  // namespace moe::cli
