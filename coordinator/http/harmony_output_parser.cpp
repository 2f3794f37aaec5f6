#include "coordinator/http/harmony_output_parser.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "common/bounded_json.h"

namespace moe::http {

namespace {

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kTo = "to=";
constexpr std::string_view kFunctions = "functions.";
// Where a body ends.
constexpr std::array<std::string_view, 4> kBodyEnds = {"<|end|>", "<|return|>", "<|call|>", kStart};
// A header longer than this is not one: the model is writing plain text.
constexpr size_t kMaxHeader = 256;

// The word after `key` in a header: up to whitespace or the next marker.
std::string word_after(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  size_t b = at + key.size();
  while (b < header.size() && header[b] == ' ') ++b;
  size_t e = b;
  while (e < header.size() && header[e] != ' ' && header[e] != '<' && header[e] != '\n') ++e;
  return std::string(header.substr(b, e - b));
}

}  // namespace

HarmonyOutputParser::HarmonyOutputParser(std::string id_seed) : id_seed_(std::move(id_seed)) {}

ParsedDelta HarmonyOutputParser::push(std::string_view text) {
  if (state_ == State::kDone) throw std::logic_error("HarmonyOutputParser::push after finish");
  buf_.append(text);
  ParsedDelta out;
  run(out, false);
  return out;
}

ParsedDelta HarmonyOutputParser::finish() {
  if (state_ == State::kDone) throw std::logic_error("HarmonyOutputParser::finish called twice");
  ParsedDelta out;
  run(out, true);
  state_ = State::kDone;
  return out;
}

void HarmonyOutputParser::start_body(std::string_view header) {
  const std::string to = word_after(header, kTo);
  const std::string channel = word_after(header, kChannel);
  if (to.size() > kFunctions.size() && to.compare(0, kFunctions.size(), kFunctions) == 0) {
    sink_ = Sink::kToolCall;
    call_name_ = to.substr(kFunctions.size());
    call_body_.clear();
  } else {
    sink_ = channel == "analysis" ? Sink::kReasoning : Sink::kContent;
  }
  state_ = State::kBody;
}

void HarmonyOutputParser::deliver(std::string_view text, ParsedDelta& out) {
  switch (sink_) {
    case Sink::kReasoning:
      out.reasoning.append(text);
      break;
    case Sink::kContent:
      out.content.append(text);
      break;
    case Sink::kToolCall:
      call_body_.append(text);
      break;
  }
}

void HarmonyOutputParser::end_tool_call(ParsedDelta& out) {
  // The model's text is as untrusted as a request: the same limits.
  nlohmann::ordered_json j;
  bool ok = true;
  try {
    j = parse_bounded_json(call_body_);
  } catch (const std::exception&) {
    ok = false;
  }
  if (ok && j.is_object()) {
    out.tool_calls.push_back({tool_call_id(id_seed_, n_calls_++), call_name_, j.dump()});
  } else {
    out.content.append(call_body_);  // malformed: the text as it came
  }
  call_body_.clear();
}

void HarmonyOutputParser::run(ParsedDelta& out, bool final) {
  // The decided length of buf_: all but an end that may begin one of `markers` and an
  // unfinished UTF-8 character.
  const auto decided = [this](auto const& markers) {
    size_t hold = 0;
    for (const std::string_view m : markers) hold = std::max(hold, partial_tag_suffix(buf_, m));
    const size_t end = buf_.size() - hold;
    return end - incomplete_utf8_suffix(std::string_view(buf_).substr(0, end));
  };
  for (;;) {
    switch (state_) {
      case State::kHeader: {
        const size_t at = buf_.find(kMessage);
        if (at != std::string::npos && at <= kMaxHeader) {
          start_body(std::string_view(buf_).substr(0, at));
          buf_.erase(0, at + kMessage.size());
          continue;
        }
        if (final || buf_.size() > kMaxHeader + kMessage.size()) {
          // Not a message: plain text, and whatever follows is content too.
          sink_ = Sink::kContent;
          state_ = State::kBody;
          continue;
        }
        return;
      }
      case State::kBody: {
        size_t at = std::string::npos, len = 0;
        std::string_view marker;
        for (const std::string_view m : kBodyEnds) {
          const size_t p = buf_.find(m);
          if (p < at) {
            at = p;
            len = m.size();
            marker = m;
          }
        }
        if (at != std::string::npos) {
          deliver(std::string_view(buf_).substr(0, at), out);
          if (sink_ == Sink::kToolCall) end_tool_call(out);
          buf_.erase(0, at + len);
          state_ = marker == kStart ? State::kHeader : State::kBetween;
          continue;
        }
        if (final) {
          deliver(buf_, out);
          buf_.clear();
          if (sink_ == Sink::kToolCall) {  // unfinished: the text as it came
            out.content.append(call_body_);
            call_body_.clear();
          }
          return;
        }
        const size_t n = decided(kBodyEnds);
        deliver(std::string_view(buf_).substr(0, n), out);
        buf_.erase(0, n);
        return;
      }
      case State::kBetween: {
        const size_t at = buf_.find(kStart);
        if (at == 0) {
          buf_.erase(0, kStart.size());
          state_ = State::kHeader;
          continue;
        }
        // Text between messages: content, up to the next message.
        const size_t n = at != std::string::npos ? at
                         : final                 ? buf_.size()
                                                 : decided(std::array{kStart});
        out.content.append(buf_, 0, n);
        buf_.erase(0, n);
        if (at != std::string::npos) continue;
        return;
      }
      case State::kDone:
        return;
    }
  }
}

}  // namespace moe::http
