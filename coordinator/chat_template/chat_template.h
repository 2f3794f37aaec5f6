// Chat templates: renders OpenAI-style messages to a prompt with the model's Jinja template
// (GGUF key tokenizer.chat_template) the way Hugging Face apply_chat_template does (jinja2 with
// trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now and a json.dumps-based
// tojson).
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "coordinator/chat_template/jinja_limits.h"

namespace moe {

struct ChatTemplateInputs {
  nlohmann::ordered_json messages;  // array of message objects, passed through unchanged
  nlohmann::ordered_json tools;     // null when absent (the template sees None)
  bool add_generation_prompt = false;
  std::optional<bool> enable_thinking;  // only defined in the template when set
  std::string bos_token, eos_token;
  // More variables by name (an object; HF's apply_chat_template **kwargs, llama-server's
  // chat_template_kwargs), e.g. gpt-oss's reasoning_effort. They may not replace the ones above.
  nlohmann::ordered_json extra;
  // The date and time strftime_now(format) formats (local time); unset: the time of the render.
  std::optional<std::time_t> now;
};

class ChatTemplate {
 public:
  // Parses once. Throws moe::Error ("chat template line L, column C: ...") on syntax errors,
  // unknown filters/tests and unsupported tags.
  explicit ChatTemplate(std::string source, jinja::Limits limits = {});
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Thread-safe (the parsed template is immutable). Throws moe::Error with the template position
  // on runtime errors, including the message of a raise_exception() call.
  std::string render(const ChatTemplateInputs& inputs) const;

  const std::string& source() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe
