#include "coordinator/chat_template/chat_template.h"

#include <ctime>
#include <string>

#include "common/error.h"
#include "coordinator/chat_template/jinja_ast.h"
#include "coordinator/chat_template/jinja_error.h"
#include "coordinator/chat_template/jinja_interpreter.h"
#include "coordinator/chat_template/jinja_json.h"
#include "coordinator/chat_template/jinja_lexer.h"
#include "coordinator/chat_template/jinja_parser.h"
#include "coordinator/chat_template/jinja_unicode.h"

namespace moe {
namespace {

// strftime_now(format): the render's date in local time, as Python's datetime.now().strftime.
std::string strftime_at(std::time_t now, const jinja::CallArgs& a) {
  const jinja::Value f = a.get(0, "format");
  if (!f.is_string()) throw jinja::Error("strftime_now() expects a format string");
  const std::string& format = f.as_string();
  if (format.size() > 64) throw jinja::Error("strftime_now(): the format is longer than 64 bytes");
  if (format.empty()) return {};
  std::tm tm{};
  if (!localtime_r(&now, &tm)) throw jinja::Error("strftime_now(): the local time is unknown");
  char buf[256];
  const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
  if (n == 0) throw jinja::Error("strftime_now(): the formatted date is empty or too long");
  return std::string(buf, n);
}

}  // namespace

struct ChatTemplate::Impl {
  std::string source;  // newline-normalized; error positions refer to it
  jinja::Body program;
  jinja::Limits limits;

  // "chat template line L, column C: message" (1-based; columns count code points).
  moe::Error to_error(const jinja::Error& e) const {
    if (e.pos() == jinja::kNoPos || e.pos() > source.size()) {
      return moe::Error(std::string("chat template: ") + e.what());
    }
    size_t line = 1, line_start = 0;
    for (size_t i = 0; i < e.pos(); ++i) {
      if (source[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    const size_t column =
        jinja::utf8_length(std::string_view(source).substr(line_start, e.pos() - line_start)) + 1;
    return moe::Error("chat template line " + std::to_string(line) + ", column " +
                      std::to_string(column) + ": " + e.what());
  }
};

ChatTemplate::ChatTemplate(std::string source, jinja::Limits limits)
    : impl_(std::make_unique<Impl>()) {
  if (source.size() > limits.max_source_bytes)
    throw moe::Error("chat template is larger than the limit");
  impl_->source = jinja::normalize_source(source);
  impl_->limits = limits;
  try {
    impl_->program =
        jinja::parse(jinja::tokenize(impl_->source, jinja::LexOptions{}), limits.max_nesting);
    jinja::validate(impl_->program);
  } catch (const jinja::Error& e) {
    throw impl_->to_error(e);
  }
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

const std::string& ChatTemplate::source() const { return impl_->source; }

std::string ChatTemplate::render(const ChatTemplateInputs& in) const {
  try {
    jinja::Dict vars;
    vars.set("messages", jinja::from_json(in.messages));
    vars.set("tools", in.tools.is_null() ? jinja::Value::none() : jinja::from_json(in.tools));
    vars.set("add_generation_prompt", jinja::Value(in.add_generation_prompt));
    if (in.enable_thinking) vars.set("enable_thinking", jinja::Value(*in.enable_thinking));
    vars.set("bos_token", jinja::Value(in.bos_token));
    vars.set("eos_token", jinja::Value(in.eos_token));
    const std::time_t now = in.now ? *in.now : std::time(nullptr);
    vars.set("strftime_now",
             jinja::Value(jinja::Function{"strftime_now", [now](jinja::CallArgs& a) {
                                            return jinja::Value(strftime_at(now, a));
                                          }}));
    if (!in.extra.is_null()) {
      if (!in.extra.is_object()) throw moe::Error("chat template variables must be an object");
      for (const auto& [name, value] : in.extra.items()) {
        if (vars.find(name)) {
          throw moe::Error("chat template variable '" + name + "' is set by the request already");
        }
        vars.set(name, jinja::from_json(value));
      }
    }
    return jinja::render(impl_->program, vars, impl_->limits);
  } catch (const jinja::Error& e) {
    throw impl_->to_error(e);
  }
}

}  // namespace moe
