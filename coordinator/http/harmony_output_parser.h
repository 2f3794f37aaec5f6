// Splits a gpt-oss chat reply in OpenAI's harmony format, as it streams out of the model, into
// reasoning, content and tool calls. The prompt ends with `<|start|>assistant`; the reply is a
// sequence of messages
//
//   <|channel|>analysis<|message|>{reasoning}<|end|>
//   <|start|>assistant<|channel|>commentary to=functions.NAME
//   <|constrain|>json<|message|>{args}<|call|>
//   <|start|>assistant<|channel|>final<|message|>{content}<|return|>
//
// each a header up to `<|message|>` (role, `<|channel|>NAME`, an optional recipient `to=...` before
// or after the channel, an optional content type) and a body up to `<|end|>`, `<|return|>`,
// `<|call|>` or a new `<|start|>`.
// Rules (the same whichever way the text is split into push() calls):
// - analysis bodies are reasoning; final bodies, commentary without a recipient (a preamble meant
//   for the user) and bodies of any other channel are content, streamed as they come.
// - A body addressed to `functions.NAME` becomes a tool call once it ends, when it is a JSON
//   object (its compact text is the arguments); otherwise it stays content, verbatim.
// - Text that is not a message (no header within 256 bytes, text between messages, an unfinished
//   header at the end) is content, verbatim; an unfinished tool call at the end is content.
// - Text that may be the start of a marker and an incomplete UTF-8 sequence are held back until
//   they cannot be; finish() releases what is left.
#pragma once

#include <string>
#include <string_view>

#include "coordinator/http/parsed_output.h"

namespace moe::http {

class HarmonyOutputParser {
 public:
  // `id_seed` is passed to tool_call_id() for the ids of this reply's tool calls.
  explicit HarmonyOutputParser(std::string id_seed = {});

  // Feeds the next piece of generated text (any split, even inside a UTF-8 character).
  ParsedDelta push(std::string_view text);
  // Ends the reply and releases what was held back. Call it once; push() after it throws.
  ParsedDelta finish();

  size_t tool_call_count() const { return n_calls_; }

 private:
  enum class State { kHeader, kBody, kBetween, kDone };
  enum class Sink { kReasoning, kContent, kToolCall };

  void run(ParsedDelta& out, bool final);
  void start_body(std::string_view header);
  void deliver(std::string_view text, ParsedDelta& out);
  void end_tool_call(ParsedDelta& out);

  State state_ = State::kHeader;
  Sink sink_ = Sink::kContent;
  std::string buf_;        // text not yet returned
  std::string call_name_;  // the function a kToolCall body is addressed to
  std::string call_body_;  // its body so far
  std::string id_seed_;
  size_t n_calls_ = 0;
};

}  // namespace moe::http
