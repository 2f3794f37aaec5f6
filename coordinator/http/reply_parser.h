// One interface over the chat reply parsers (Qwen3's tags, gpt-oss's harmony messages), and the
// choice between them by the model's vocabulary, so the HTTP server streams either the same way.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "coordinator/http/parsed_output.h"
#include "coordinator/tokenizer/vocab.h"

namespace moe::http {

enum class ReplyFormat { kQwen, kHarmony };

// Harmony when the vocabulary has its message markers (<|start|>, <|channel|>, <|message|>):
// the gpt-oss family's o200k_harmony; else Qwen3's <think> / <tool_call> tags.
ReplyFormat reply_format(const tokenizer::Vocab& vocab);

class ReplyParser {
 public:
  virtual ~ReplyParser() = default;
  // The next piece of generated text (any split, even inside a UTF-8 character).
  virtual ParsedDelta push(std::string_view text) = 0;
  // The text of the end-of-generation token that stopped the reply. Harmony's <|call|> closes a
  // tool call and <|return|> the final message, so they are parsed; Qwen3's <|im_end|> is not
  // part of the reply.
  virtual ParsedDelta end_token(std::string_view text) = 0;
  // Ends the reply and releases what was held back; once.
  virtual ParsedDelta finish() = 0;
  virtual size_t tool_call_count() const = 0;
};

// `reasoning_started`: the prompt already opened Qwen3's <think> (harmony has no such prefix).
// `id_seed`: passed to tool_call_id() for the reply's tool call ids.
std::unique_ptr<ReplyParser> make_reply_parser(ReplyFormat format, bool reasoning_started,
                                               std::string id_seed);

}  // namespace moe::http
