#include "coordinator/http/reply_parser.h"

#include <utility>

#include "coordinator/http/harmony_output_parser.h"
#include "coordinator/http/qwen_output_parser.h"

namespace moe::http {
namespace {

class QwenReply final : public ReplyParser {
 public:
  QwenReply(bool reasoning_started, std::string id_seed)
      : p_(reasoning_started, std::move(id_seed)) {}
  ParsedDelta push(std::string_view text) override { return p_.push(text); }
  ParsedDelta end_token(std::string_view) override { return {}; }
  ParsedDelta finish() override { return p_.finish(); }
  size_t tool_call_count() const override { return p_.tool_call_count(); }

 private:
  QwenOutputParser p_;
};

class HarmonyReply final : public ReplyParser {
 public:
  explicit HarmonyReply(std::string id_seed) : p_(std::move(id_seed)) {}
  ParsedDelta push(std::string_view text) override { return p_.push(text); }
  ParsedDelta end_token(std::string_view text) override { return p_.push(text); }
  ParsedDelta finish() override { return p_.finish(); }
  size_t tool_call_count() const override { return p_.tool_call_count(); }

 private:
  HarmonyOutputParser p_;
};

}  // namespace

ReplyFormat reply_format(const tokenizer::Vocab& vocab) {
  const bool harmony = vocab.find("<|start|>") >= 0 && vocab.find("<|channel|>") >= 0 &&
                       vocab.find("<|message|>") >= 0;
  return harmony ? ReplyFormat::kHarmony : ReplyFormat::kQwen;
}

std::unique_ptr<ReplyParser> make_reply_parser(ReplyFormat format, bool reasoning_started,
                                               std::string id_seed) {
  if (format == ReplyFormat::kHarmony) return std::make_unique<HarmonyReply>(std::move(id_seed));
  return std::make_unique<QwenReply>(reasoning_started, std::move(id_seed));
}

}  // namespace moe::http
