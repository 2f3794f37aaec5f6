// What a chat reply's parser returns as the text streams out of the model (OpenAI's
// reasoning_content / content / tool_calls), whatever the model's format (Qwen3's tags, gpt-oss's
// harmony channels), and the helpers both parsers use to hold back undecided text.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace moe::http {

struct ParsedToolCall {
  std::string id;              // "call_" + 22 letters and digits, see tool_call_id()
  std::string name;            // the function's name
  std::string arguments_json;  // the arguments object as compact JSON text (OpenAI's "arguments")

  bool operator==(const ParsedToolCall&) const = default;
};

// New output from one push() / finish(), or all of it when deltas are appended together.
struct ParsedDelta {
  std::string content;
  std::string reasoning;
  std::vector<ParsedToolCall> tool_calls;

  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  void append(const ParsedDelta& d);

  bool operator==(const ParsedDelta&) const = default;
};

// The id of tool call number `n` (0-based) of a reply: "call_" followed by 22 letters and digits,
// a function of (seed, n) that differs for every n of one seed. Give each request its own seed
// (e.g. the completion id) so that ids differ across requests yet are reproducible.
std::string tool_call_id(std::string_view seed, size_t n);

// Length of the longest end of `s` that is a proper beginning of `tag` (it may become the tag).
size_t partial_tag_suffix(std::string_view s, std::string_view tag);

// Bytes at the end of `s` that begin a UTF-8 sequence whose remaining bytes have not arrived.
size_t incomplete_utf8_suffix(std::string_view s);

}  // namespace moe::http
