// Splits a Qwen3 chat reply, as it streams out of the model, into reasoning, content and tool calls
// (OpenAI's reasoning_content / content / tool_calls). Qwen3 writes
//
//   <think>\n{reasoning}\n</think>\n\n{content}<tool_call>\n{"name": ..., "arguments":
//   {...}}\n</tool_call>
//
// Rules (the same whichever way the text is split into push() calls):
// - `<think>` is recognised only at the start of the reply (after optional whitespace); text up to
//   `</think>` is reasoning. With reasoning_started (the prompt already ended with `<think>`), the
//   reply starts inside the reasoning. Whitespace at both ends of the reasoning is dropped, and so
//   is the whitespace after `</think>`. An unterminated reasoning block stays reasoning.
// - In the content, a complete `<tool_call>...</tool_call>` whose body is a JSON object with a
//   string "name" and an object (or string) "arguments" becomes a tool call; the whitespace right
//   before and after it is dropped. A malformed or unterminated one stays content, verbatim.
// - `<tool_call>` inside the reasoning, and `<think>` later in the reply, are plain text.
// - Text that may be the start of a tag, whitespace that may precede one, and an incomplete UTF-8
//   sequence are held back until they cannot be; finish() releases what is left.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "coordinator/http/parsed_output.h"

namespace moe::http {

class QwenOutputParser {
 public:
  // `id_seed` is passed to tool_call_id() for the ids of this reply's tool calls.
  explicit QwenOutputParser(bool reasoning_started = false, std::string id_seed = {});

  // Feeds the next piece of generated text (any split, even inside a UTF-8 character).
  ParsedDelta push(std::string_view text);
  // Ends the reply and releases what was held back. Call it once; push() after it throws.
  ParsedDelta finish();

  // Tool calls returned so far (the next one's index in OpenAI's streaming deltas).
  size_t tool_call_count() const { return n_calls_; }

 private:
  enum class State { kStart, kReasoning, kContent, kToolCall, kDone };

  void run(ParsedDelta& out, bool final);
  bool parse_tool_call(std::string_view body, ParsedDelta& out);

  State state_;
  std::string buf_;             // text not yet returned or dropped
  bool skip_ws_ = false;        // drop whitespace at the front of buf_ (after a closing tag)
  std::string ws_before_call_;  // whitespace dropped before `<tool_call>`, restored if malformed
  std::string id_seed_;
  size_t n_calls_ = 0;
};

}  // namespace moe::http
