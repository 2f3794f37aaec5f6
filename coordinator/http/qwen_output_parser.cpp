#include "coordinator/http/qwen_output_parser.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "common/bounded_json.h"

namespace moe::http {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t first_non_space(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

// Length of `s` without its trailing whitespace.
size_t trimmed_end(std::string_view s) {
  size_t e = s.size();
  while (e > 0 && is_space(s[e - 1])) --e;
  return e;
}

}  // namespace

QwenOutputParser::QwenOutputParser(bool reasoning_started, std::string id_seed)
    : state_(reasoning_started ? State::kReasoning : State::kStart),
      skip_ws_(reasoning_started),
      id_seed_(std::move(id_seed)) {}

ParsedDelta QwenOutputParser::push(std::string_view text) {
  if (state_ == State::kDone) throw std::logic_error("QwenOutputParser::push after finish");
  buf_.append(text);
  ParsedDelta out;
  run(out, false);
  return out;
}

ParsedDelta QwenOutputParser::finish() {
  if (state_ == State::kDone) throw std::logic_error("QwenOutputParser::finish called twice");
  ParsedDelta out;
  run(out, true);
  state_ = State::kDone;
  return out;
}

bool QwenOutputParser::parse_tool_call(std::string_view body, ParsedDelta& out) {
  // The model's text is as untrusted as a request: the same limits, so dump() below stays shallow.
  nlohmann::ordered_json j;
  try {
    j = parse_bounded_json(body);
  } catch (const std::exception&) {  // malformed or over a limit: left as text
    return false;
  }
  if (!j.is_object()) return false;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return false;
  }
  ParsedToolCall call;
  call.name = name->get<std::string>();
  const auto args = j.find("arguments");
  if (args == j.end() || args->is_null()) {
    call.arguments_json = "{}";
  } else if (args->is_object()) {
    call.arguments_json = args->dump();
  } else if (args->is_string()) {
    call.arguments_json = args->get<std::string>();  // already JSON text
  } else {
    return false;
  }
  call.id = tool_call_id(id_seed_, n_calls_++);
  out.tool_calls.push_back(std::move(call));
  return true;
}

void QwenOutputParser::run(ParsedDelta& out, bool final) {
  // Moves the decided front of buf_ to `dst`: everything except an end that may start `tag`,
  // the whitespace before that (it may precede the tag), and an unfinished UTF-8 character.
  const auto release_undecided = [this](std::string& dst, std::string_view tag) {
    const std::string_view b = buf_;
    size_t end = trimmed_end(b.substr(0, b.size() - partial_tag_suffix(b, tag)));
    end -= incomplete_utf8_suffix(b.substr(0, end));
    dst.append(b.substr(0, end));
    buf_.erase(0, end);
  };

  for (;;) {
    if (skip_ws_) {
      buf_.erase(0, first_non_space(buf_));
      if (buf_.empty()) return;  // more whitespace may follow
      skip_ws_ = false;
    }
    const std::string_view b = buf_;
    switch (state_) {
      case State::kStart: {
        const size_t p = first_non_space(b);
        const std::string_view rest = b.substr(p);
        if (rest.starts_with(kThinkOpen)) {
          buf_.erase(0, p + kThinkOpen.size());
          state_ = State::kReasoning;
          skip_ws_ = true;
          continue;
        }
        if (!final && kThinkOpen.starts_with(rest)) return;  // may still become "<think>"
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t pos = b.find(kThinkClose);
        if (pos != std::string_view::npos) {
          out.reasoning.append(b.substr(0, trimmed_end(b.substr(0, pos))));
          buf_.erase(0, pos + kThinkClose.size());
          state_ = State::kContent;
          skip_ws_ = true;
          continue;
        }
        if (final) {
          out.reasoning.append(b.substr(0, trimmed_end(b)));
          buf_.clear();
        } else {
          release_undecided(out.reasoning, kThinkClose);
        }
        return;
      }
      case State::kContent: {
        const size_t pos = b.find(kCallOpen);
        if (pos != std::string_view::npos) {
          const size_t text_end = trimmed_end(b.substr(0, pos));
          out.content.append(b.substr(0, text_end));
          ws_before_call_ = std::string(b.substr(text_end, pos - text_end));
          buf_.erase(0, pos + kCallOpen.size());
          state_ = State::kToolCall;
          continue;
        }
        if (final) {
          out.content.append(buf_);
          buf_.clear();
        } else {
          release_undecided(out.content, kCallOpen);
        }
        return;
      }
      case State::kToolCall: {
        const size_t pos = b.find(kCallClose);
        if (pos != std::string_view::npos) {
          const std::string_view body = b.substr(0, pos);
          if (parse_tool_call(body, out)) {
            skip_ws_ = true;
          } else {  // malformed: the text as it came
            out.content.append(ws_before_call_).append(kCallOpen).append(body).append(kCallClose);
          }
          ws_before_call_.clear();
          buf_.erase(0, pos + kCallClose.size());
          state_ = State::kContent;
          continue;
        }
        if (final) {  // unterminated: the text as it came
          out.content.append(ws_before_call_).append(kCallOpen).append(buf_);
          ws_before_call_.clear();
          buf_.clear();
        }
        return;
      }
      case State::kDone:
        return;
    }
  }
}

}  // namespace moe::http
