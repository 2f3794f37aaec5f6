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

// Length of the longest end of `s` that is a proper beginning of `tag` (it may become the tag).
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t k = std::min(s.size(), tag.size() - 1); k > 0; --k) {
    if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

// Bytes at the end of `s` that begin a UTF-8 sequence whose remaining bytes have not arrived.
size_t incomplete_utf8_suffix(std::string_view s) {
  for (size_t i = 1; i <= 3 && i <= s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[s.size() - i]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    if (c < 0xC0) return 0;            // ASCII
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    return need > i ? i : 0;
  }
  return 0;
}

// splitmix64's output function: a bijection of 64-bit words.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void append_base62(uint64_t v, int digits, std::string& out) {
  static constexpr char kDigits[] =
      "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  for (int i = 0; i < digits; ++i) {
    out += kDigits[v % 62];
    v /= 62;
  }
}

}  // namespace

void ParsedDelta::append(const ParsedDelta& d) {
  content += d.content;
  reasoning += d.reasoning;
  tool_calls.insert(tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
}

std::string tool_call_id(std::string_view seed, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a of the seed
  for (const char c : seed) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  // Distinct n give distinct states (the step is odd), and mix64 keeps them distinct; 11 base-62
  // digits hold all 64 bits, so the first 11 characters already differ. The rest is decoration.
  const uint64_t state = h + static_cast<uint64_t>(n) * 0x9e3779b97f4a7c15ULL;
  std::string id = "call_";
  append_base62(mix64(state), 11, id);
  append_base62(mix64(state ^ 0x5851f42d4c957f2dULL), 11, id);
  return id;
}

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
