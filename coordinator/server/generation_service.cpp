#include "coordinator/server/generation_service.h"

#include <memory>

namespace moe::server {

namespace {

// How often a waiting Generate looks at its stream for cancellation: the bound on how late a
// closed stream is noticed between tokens.
constexpr std::chrono::milliseconds kPoll{20};

grpc::Status starting() {
  return {grpc::StatusCode::UNAVAILABLE, "the coordinator is starting or stopping"};
}

grpc::Status to_status(const engine::JobEvent& ev) {
  switch (ev.error) {
    case engine::JobError::Cancelled:
      return {grpc::StatusCode::CANCELLED, ev.message};
    case engine::JobError::Unavailable:
      return {grpc::StatusCode::UNAVAILABLE, ev.message};
    default:
      return {grpc::StatusCode::INTERNAL, ev.message};
  }
}

void fill_finish(const engine::JobEvent& ev, v1::Finish& f) {
  f.set_reason(finish_reason_to_proto(ev.reason));
  f.set_stop_string(ev.stop_string);
  f.set_prompt_tokens(static_cast<int32_t>(ev.prompt_tokens));
  f.set_completion_tokens(static_cast<int32_t>(ev.completion_tokens));
  f.set_cached_tokens(static_cast<int32_t>(ev.cached_tokens));
  f.set_seed(ev.seed);
  v1::Timings& t = *f.mutable_timings();
  t.set_queue_ms(ev.timings.queue_ms);
  t.set_prompt_ms(ev.timings.prompt_ms);
  t.set_generation_ms(ev.timings.generation_ms);
  if (ev.timings.prompt_ms > 0) {
    t.set_prompt_tokens_per_second(1e3 * static_cast<double>(ev.prompt_tokens - ev.cached_tokens) /
                                   ev.timings.prompt_ms);
  }
  if (ev.timings.generation_ms > 0) {
    t.set_tokens_per_second(1e3 * static_cast<double>(ev.timings.decode_steps) /
                            ev.timings.generation_ms);
  }
}

}  // namespace

grpc::Status GenerationService::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (grpc::Status st = auth_.client(*ctx); !st.ok()) return st;
  engine::Engine* eng = state_.engine.load();
  if (eng == nullptr) return starting();
  engine::JobRequest jr;
  try {
    jr = to_job_request(*req, state_.limits);
  } catch (const BadRequest& e) {
    return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
  } catch (const std::exception& e) {  // the tokenizer's own errors are the input's fault too
    return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
  }
  // Counted so that shutdown can let streams end with their status before closing connections.
  state_.active_streams.fetch_add(1);
  struct Done {
    std::atomic<int>& n;
    ~Done() { n.fetch_sub(1); }
  } done{state_.active_streams};
  auto job = std::make_shared<engine::Job>(std::move(jr));
  switch (eng->submit(job)) {
    case engine::Engine::Admit::Ok:
      break;
    case engine::Engine::Admit::QueueFull:
      return {grpc::StatusCode::RESOURCE_EXHAUSTED,
              "the request queue is full (" + std::to_string(eng->stats().queue_capacity) +
                  " waiting); retry later"};
    case engine::Engine::Admit::Draining:
      return {grpc::StatusCode::UNAVAILABLE, "the coordinator is draining"};
  }
  for (;;) {
    std::optional<engine::JobEvent> ev = job->wait_event(kPoll);
    if (!ev) {
      if (ctx->IsCancelled()) {
        job->cancel();  // the scheduler drops it at the next token and frees its cache
        return {grpc::StatusCode::CANCELLED, "the client cancelled or the deadline passed"};
      }
      continue;
    }
    v1::GenerateResponse resp;
    switch (ev->kind) {
      case engine::JobEvent::Chunk: {
        v1::Chunk& c = *resp.mutable_chunk();
        for (int32_t t : ev->tokens) c.add_token_ids(t);
        c.set_text(std::move(ev->text));
        for (const sampling::Logprobs& lp : ev->logprobs) {
          *c.add_logprobs() = logprobs_to_proto(lp, *state_.limits.tok);
        }
        if (!writer->Write(resp)) {
          job->cancel();
          return {grpc::StatusCode::CANCELLED, "the stream was closed"};
        }
        break;
      }
      case engine::JobEvent::Finish:
        fill_finish(*ev, *resp.mutable_finish());
        writer->Write(resp);
        return grpc::Status::OK;
      case engine::JobEvent::Failed:
        return to_status(*ev);
    }
  }
}

grpc::Status GenerationService::Tokenize(grpc::ServerContext* ctx, const v1::TokenizeRequest* req,
                                         v1::TokenizeResponse* resp) {
  if (grpc::Status st = auth_.client(*ctx); !st.ok()) return st;
  if (state_.engine.load() == nullptr) return starting();
  const tokenizer::Tokenizer& tok = *state_.limits.tok;
  try {
    require_utf8(req->text(), "text");
    std::vector<int32_t> ids;
    if (req->add_special() && tok.add_bos() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
    const std::vector<int32_t> body = tok.encode(req->text(), req->parse_special());
    ids.insert(ids.end(), body.begin(), body.end());
    for (int32_t id : ids) {
      resp->add_ids(id);
      if (req->with_pieces()) resp->add_pieces(tok.token_piece(id, true));
    }
  } catch (const std::exception& e) {
    return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
  }
  return grpc::Status::OK;
}

grpc::Status GenerationService::Detokenize(grpc::ServerContext* ctx,
                                           const v1::DetokenizeRequest* req,
                                           v1::DetokenizeResponse* resp) {
  if (grpc::Status st = auth_.client(*ctx); !st.ok()) return st;
  if (state_.engine.load() == nullptr) return starting();
  const tokenizer::Tokenizer& tok = *state_.limits.tok;
  std::vector<int32_t> ids(req->ids().begin(), req->ids().end());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= tok.n_vocab()) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              "ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                  " is not a token id (the vocabulary has " + std::to_string(tok.n_vocab()) + ")"};
    }
  }
  resp->set_text(tok.decode(ids, /*remove_special=*/req->skip_special(),
                            /*unparse_special=*/!req->skip_special()));
  return grpc::Status::OK;
}

grpc::Status GenerationService::ApplyChatTemplate(grpc::ServerContext* ctx,
                                                  const v1::ApplyChatTemplateRequest* req,
                                                  v1::ApplyChatTemplateResponse* resp) {
  if (grpc::Status st = auth_.client(*ctx); !st.ok()) return st;
  if (state_.engine.load() == nullptr) return starting();
  try {
    std::string text = render_chat(req->chat(), state_.limits, true);
    if (req->tokenize()) {
      for (int32_t id : tokenize_prompt(text, *state_.limits.tok)) resp->add_ids(id);
    }
    resp->set_text(std::move(text));
  } catch (const BadRequest& e) {
    return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
  }
  return grpc::Status::OK;
}

}  // namespace moe::server
