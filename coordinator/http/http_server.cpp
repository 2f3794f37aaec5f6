#include "coordinator/http/http_server.h"

#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "coordinator/http/openai_request.h"
#include "coordinator/http/openai_response.h"
#include "coordinator/http/qwen_output_parser.h"
#include "coordinator/server/request_validation.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace moe::http {

namespace {

// Qwen3.5/3.6 templates open the reasoning block in the prompt ("<think>\n" at its end), so the
// reply starts inside it; Qwen3's templates leave it to the model.
bool prompt_opens_reasoning(const std::vector<int32_t>& prompt, const tokenizer::Tokenizer* tok) {
  if (tok == nullptr || prompt.empty()) return false;
  const size_t n = std::min<size_t>(prompt.size(), 4);
  std::string tail = tok->decode(std::span<const int32_t>(prompt.data() + prompt.size() - n, n),
                                 /*remove_special=*/false, /*unparse_special=*/true);
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  return tail.size() >= 7 && tail.compare(tail.size() - 7, 7, "<think>") == 0;
}

using json = nlohmann::ordered_json;
constexpr std::chrono::milliseconds kPoll{20};

void send_error(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  res.set_content(error_body(e).dump(), "application/json");
}

HttpError error(int status, const std::string& message, const std::string& type = {}) {
  return HttpError(status, message, std::nullopt, type);
}

std::string sse(const json& j) { return "data: " + j.dump() + "\n\n"; }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A request id that differs between requests and processes.
std::string request_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  return std::string(prefix) + std::to_string(unix_now()) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1));
}

// What one generation request accumulates: text routed through the Qwen parser for chat.
struct Collected {
  ParsedDelta all;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
};

HttpError job_error(const engine::JobEvent& ev) {
  if (ev.error == engine::JobError::Unavailable) {
    return error(503, ev.message, "unavailable_error");
  }
  return error(500, ev.message, "server_error");
}

}  // namespace

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

HttpServer::HttpServer(HttpOptions opt, server::ServingState& state,
                       engine::WorkerRegistry& registry, Metrics& metrics)
    : opt_(std::move(opt)),
      state_(state),
      registry_(registry),
      metrics_(metrics),
      server_(std::make_unique<httplib::Server>()) {
  if (!is_loopback(opt_.host) && opt_.api_key.empty()) {
    throw Error("HTTP on " + opt_.host + " (not a loopback address) needs --api-key");
  }
  const int threads = opt_.threads;
  server_->new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  server_->set_payload_max_length(opt_.max_body_bytes);
  routes();
  port_ = opt_.port == 0 ? server_->bind_to_any_port(opt_.host)
                         : (server_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  if (port_ <= 0) {
    throw Error("HTTP: cannot listen on " + opt_.host + ":" + std::to_string(opt_.port));
  }
  listener_ = std::thread([this] { server_->listen_after_bind(); });
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::stop() {
  if (server_) server_->stop();
  if (listener_.joinable()) listener_.join();
}

void HttpServer::routes() {
  httplib::Server& s = *server_;
  // Authentication before routing, so no route can forget it; /health stays open for probes.
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opt_.api_key.empty() || req.path == "/health")
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth == "Bearer " + opt_.api_key) return httplib::Server::HandlerResponse::Unhandled;
    send_error(
        res,
        error(401, auth.empty() ? "missing API key (Authorization: Bearer KEY)" : "invalid API key",
              "authentication_error"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses httplib produces itself (404, 413, ...) get the same JSON shape as ours.
  s.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string msg = res.status == 413   ? "request body too large"
                            : res.status == 404 ? "no such route"
                                                : "HTTP error " + std::to_string(res.status);
    send_error(res, error(res.status, msg,
                          res.status == 404 ? "not_found_error" : "invalid_request_error"));
  });
  s.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string msg = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          msg = e.what();
        } catch (...) {
        }
        send_error(res, error(500, msg, "server_error"));
      });
  s.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // Known routes only, so a scanner's random paths cannot grow the label set.
    static const std::set<std::string> known = {"/health", "/metrics", "/v1/models",
                                                "/v1/chat/completions", "/v1/completions"};
    metrics_.http_response(known.count(req.path) ? req.path : std::string("other"), res.status);
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (state_.engine.load() == nullptr) {
      send_error(res,
                 error(503, "the model is loading or the server is stopping", "unavailable_error"));
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(models_list(opt_.model_id, unix_now()).dump(), "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.scrape(state_, registry_), "text/plain; version=0.0.4");
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generation(req, res, /*chat=*/true);
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generation(req, res, /*chat=*/false);
  });
}

void HttpServer::generation(const httplib::Request& req, httplib::Response& res, bool chat) {
  engine::Engine* eng = state_.engine.load();
  if (eng == nullptr) {
    send_error(res,
               error(503, "the model is loading or the server is stopping", "unavailable_error"));
    return;
  }
  OpenAiOptions opts;
  std::shared_ptr<engine::Job> job;
  try {
    const json body = parse_json_body(req.body);
    const v1::GenerateRequest greq =
        chat ? chat_completion_request(body, &opts) : completion_request(body, &opts);
    job = std::make_shared<engine::Job>(server::to_job_request(greq, state_.limits));
  } catch (const HttpError& e) {
    send_error(res, e);
    return;
  } catch (const std::exception& e) {  // BadRequest and the tokenizer's errors
    send_error(res, error(400, e.what(), "invalid_request_error"));
    return;
  }
  switch (eng->submit(job)) {
    case engine::Engine::Admit::Ok:
      break;
    case engine::Engine::Admit::QueueFull:
      res.set_header("Retry-After", "1");
      send_error(res, error(429, "the request queue is full; retry later", "rate_limit_error"));
      return;
    case engine::Engine::Admit::Draining:
      send_error(res, error(503, "the server is draining", "unavailable_error"));
      return;
  }
  const std::string id = request_id(chat ? "chatcmpl-" : "cmpl-");
  const bool reasoning_started =
      chat && prompt_opens_reasoning(job->request().prompt, state_.limits.tok);
  const int64_t created = unix_now();
  const std::string model = opts.model.empty() ? opt_.model_id : opts.model;

  if (!opts.stream) {
    Collected c;
    QwenOutputParser parser(reasoning_started, id);
    for (;;) {
      std::optional<engine::JobEvent> ev = job->wait_event(kPoll);
      if (!ev) continue;
      if (ev->kind == engine::JobEvent::Chunk) {
        if (chat) {
          c.all.append(parser.push(ev->text));
        } else {
          c.all.content += ev->text;
        }
        continue;
      }
      if (ev->kind == engine::JobEvent::Failed) {
        send_error(res, job_error(*ev));
        return;
      }
      if (chat) c.all.append(parser.finish());
      c.prompt_tokens = ev->prompt_tokens;
      c.completion_tokens = ev->completion_tokens;
      c.reason = server::finish_reason_to_proto(ev->reason);
      break;
    }
    const std::string_view reason = finish_reason_name(c.reason, !c.all.tool_calls.empty());
    const Usage usage{c.prompt_tokens, c.completion_tokens};
    const json out = chat ? chat_completion(id, created, model, c.all, reason, usage)
                          : text_completion(id, created, model, c.all.content, reason, usage);
    res.set_content(out.dump(), "application/json");
    return;
  }

  // Streaming: one SSE event per delta, then the finish chunk, usage if asked, and [DONE].
  res.set_header("Cache-Control", "no-cache");
  auto parser = std::make_shared<QwenOutputParser>(reasoning_started, id);
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, parser, chat, id, created, model, opts](size_t, httplib::DataSink& sink) {
        bool first = true;
        size_t tools_sent = 0;
        auto write = [&](const json& j) {
          const std::string event = sse(j);
          return sink.write(event.data(), event.size());
        };
        auto send_delta = [&](const ParsedDelta& d) {
          if (d.empty()) return true;
          const json j =
              chat ? chat_chunk(id, created, model, chat_delta(d, first, tools_sent), std::nullopt)
                   : text_chunk(id, created, model, d.content, std::nullopt);
          first = false;
          tools_sent += d.tool_calls.size();
          return write(j);
        };
        for (;;) {
          std::optional<engine::JobEvent> ev = job->wait_event(kPoll);
          if (!ev) {
            if (!sink.is_writable()) {
              job->cancel();
              return false;
            }
            continue;
          }
          if (ev->kind == engine::JobEvent::Chunk) {
            ParsedDelta d;
            if (chat) {
              d = parser->push(ev->text);
            } else {
              d.content = ev->text;
            }
            if (!send_delta(d)) {
              job->cancel();
              return false;
            }
            continue;
          }
          if (ev->kind == engine::JobEvent::Failed) {
            write(error_body(job_error(*ev)));
            sink.done();
            return true;
          }
          if (chat) send_delta(parser->finish());
          const std::string_view reason =
              finish_reason_name(server::finish_reason_to_proto(ev->reason), tools_sent > 0);
          write(chat ? chat_chunk(id, created, model, chat_delta(ParsedDelta{}, first, tools_sent),
                                  reason)
                     : text_chunk(id, created, model, "", reason));
          if (opts.include_usage) {
            const Usage usage{ev->prompt_tokens, ev->completion_tokens};
            write(chat ? chat_usage_chunk(id, created, model, usage)
                       : text_usage_chunk(id, created, model, usage));
          }
          static const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          sink.done();
          return true;
        }
      },
      [job](bool) { job->cancel(); });  // a finished job ignores it; an abandoned one stops
}

}  // namespace moe::http
