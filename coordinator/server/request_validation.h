// Turns the API's messages into what the engine runs, checking everything a client can get wrong
// (empty input, bad token ids, invalid UTF-8, unknown chat-message fields, bad sampler values,
// context overflow). Every problem throws BadRequest, answered with INVALID_ARGUMENT and its
// message, which says what is wrong and where.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "coordinator/chat_template/chat_template.h"
#include "coordinator/engine/job.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "moe/v1/generation.pb.h"

namespace moe::server {

class BadRequest : public moe::Error {
 public:
  using moe::Error::Error;
};

// What requests are checked against.
struct ModelLimits {
  const tokenizer::Tokenizer* tok = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: the model has none (chat is refused)
  int64_t n_ctx = 0;
  // The server's defaults (llama-server's --temp, --top-k, ..., -s, -n) for what a request leaves
  // unset; null / 0: llama.cpp's own.
  const v1::SamplingParams* default_sampling = nullptr;
  std::optional<uint32_t> default_seed;
  int32_t default_max_tokens = 0;  // taken by a request whose max_tokens is 0 (no limit)
};

// Throws BadRequest naming `field` and the byte offset of the first invalid sequence.
void require_utf8(const std::string& text, const std::string& field);

// The chat messages and tools as the template sees them (OpenAI's JSON shapes).
ChatTemplateInputs chat_inputs(const v1::ChatInput& chat, const ModelLimits& m,
                               bool default_generation_prompt);
std::string render_chat(const v1::ChatInput& chat, const ModelLimits& m,
                        bool default_generation_prompt);

// Prompt tokens of a text: special tokens parsed, BOS prepended when the model wants it.
std::vector<int32_t> tokenize_prompt(const std::string& text, const tokenizer::Tokenizer& tok);

engine::JobRequest to_job_request(const v1::GenerateRequest& req, const ModelLimits& m);

// The other direction, shared by the gRPC and HTTP front ends: how a job ended, as the API says it.
v1::FinishReason finish_reason_to_proto(engine::FinishReason r);

// A generated token's log-probabilities with each token's bytes.
v1::TokenLogprobs logprobs_to_proto(const sampling::Logprobs& lp, const tokenizer::Tokenizer& tok);

}  // namespace moe::server
