// The grammar a request's output must follow: its constraint (GBNF, a JSON Schema, any JSON
// object) or its chat's tool_choice ("required" or a function's name: the reply is tool calls in
// Qwen's <tool_call> syntax). A chat whose prompt leaves the model free to think, or inside an
// open <think> block, gets that block in front, so reasoning stays possible and only the answer is
// constrained.
#pragma once

#include <memory>
#include <string>

#include "coordinator/grammar/grammar.h"
#include "moe/v1/generation.pb.h"

namespace moe::server {

// How the rendered prompt leaves the model's reasoning.
enum class ThinkMode {
  None,    // no think block: the prompt closed it ("<think>\n\n</think>") or it is not a chat
  Open,    // the model may open one: "<think>" ... "</think>" first, optionally
  Inside,  // the prompt opened it ("<think>\n"): the reply starts inside it, "</think>" ends it
};
ThinkMode think_mode(const std::string& rendered_prompt, bool is_chat);

// Null when the request constrains nothing. Throws BadRequest naming the field for a grammar or
// schema that is invalid, too large or unsupported, or a tool_choice that names no offered tool.
std::shared_ptr<const grammar::Grammar> request_grammar(const v1::GenerateRequest& req,
                                                        ThinkMode think);

// The GBNF rules of a think block before `inner_root` (exposed for tests): `root ::= ...`.
std::string think_wrapper_gbnf(ThinkMode think, const std::string& inner_root);

}  // namespace moe::server
