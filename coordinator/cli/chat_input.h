// The moe.v1.ChatInput of generate and template: --chat-user TEXT [--system TEXT], or
// --messages FILE.json; plus --tools FILE.json and --no-think.
//
// A messages file is a JSON array of objects with the keys
//   role, content, reasoning_content, tool_call_id, name       strings (content may be null)
//   tool_calls   array of {id, name, arguments}; arguments is an object or its JSON text
// and nothing else: an unknown key is an error rather than silently dropped. A tools file is a
// JSON array of OpenAI-style tool definitions (objects), sent as they are.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "moe/v1/generation.pb.h"

namespace moe::cli {

struct ChatSourceArgs {
  std::optional<std::string> user;           // --chat-user
  std::optional<std::string> system;         // --system
  std::optional<std::string> messages_path;  // --messages
  std::optional<std::string> tools_path;     // --tools
  bool no_think = false;                     // --no-think: enable_thinking = false

  // True when --chat-user or --messages was given.
  bool given() const { return user.has_value() || messages_path.has_value(); }
};

// The conversation and tools of `args` (add_generation_prompt left unset). Throws UsageError naming
// the file and the element on an unreadable or invalid file.
moe::v1::ChatInput build_chat_input(const ChatSourceArgs& args);

// Appends {role, content} to the conversation.
void add_message(moe::v1::ChatInput& chat, std::string_view role, std::string_view content);

// Appends the messages of a messages file (format above).
void add_messages_file(moe::v1::ChatInput& chat, const std::string& path);

// Appends the tool definitions of a tools file, each as JSON text.
void add_tools_file(moe::v1::ChatInput& chat, const std::string& path);

}  // namespace moe::cli
