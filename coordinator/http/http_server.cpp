#include "coordinator/http/http_server.h"

#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/bounded_json.h"
#include "common/error.h"
#include "coordinator/http/connection_pool.h"
#include "coordinator/http/llama_routes.h"
#include "coordinator/http/openai_request.h"
#include "coordinator/http/openai_response.h"
#include "coordinator/http/peer_socket.h"
#include "coordinator/http/reply_parser.h"
#include "coordinator/http/webui_route.h"
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
constexpr int kListenBacklog = 512;
constexpr std::chrono::milliseconds kHealthProbeWait{5000};

void send_error(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  res.set_content(dump_lenient(error_body(e)), "application/json");
}

HttpError error(int status, const std::string& message, const std::string& type = {}) {
  return HttpError(status, message, std::nullopt, type);
}

std::string sse(const json& j) { return "data: " + dump_lenient(j) + "\n\n"; }

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
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
};

HttpError job_error(const engine::JobEvent& ev) {
  if (ev.error == engine::JobError::Unavailable) {
    return error(503, ev.message, "unavailable_error");
  }
  return error(500, ev.message, "server_error");
}

std::unique_ptr<httplib::Server> make_server(const HttpOptions& opt) {
  if (opt.ssl_cert_file.empty() && opt.ssl_key_file.empty()) {
    return std::make_unique<httplib::Server>();
  }
  auto tls =
      std::make_unique<httplib::SSLServer>(opt.ssl_cert_file.c_str(), opt.ssl_key_file.c_str());
  if (!tls->is_valid()) {
    throw Error("HTTPS: cannot load the certificate " + opt.ssl_cert_file + " and key " +
                opt.ssl_key_file);
  }
  return tls;
}

}  // namespace

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string host_header_name(const std::string& header) {
  if (!header.empty() && header[0] == '[') {
    const size_t close = header.find(']');
    return close == std::string::npos ? header : header.substr(1, close - 1);
  }
  const size_t colon = header.find(':');
  return colon == std::string::npos ? header : header.substr(0, colon);
}

HttpServer::HttpServer(HttpOptions opt, server::ServingState& state,
                       engine::WorkerRegistry& registry, Metrics& metrics)
    : opt_(std::move(opt)),
      state_(state),
      registry_(registry),
      metrics_(metrics),
      server_(make_server(opt_)) {
  if (!is_loopback(opt_.host) && opt_.api_key.empty()) {
    throw Error("HTTP on " + opt_.host + " (not a loopback address) needs --api-key");
  }
  const int threads = opt_.threads;
  server_->new_task_queue = [threads] { return new ConnectionPool(static_cast<size_t>(threads)); };
  server_->set_payload_max_length(opt_.max_body_bytes);
  // httplib's defaults also set SO_REUSEPORT, which lets a second server bind the same port and
  // take half its connections; only SO_REUSEADDR (restart over TIME_WAIT) is wanted.
  server_->set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd_ = sock;
  });
  routes();
  port_ = opt_.port == 0 ? server_->bind_to_any_port(opt_.host)
                         : (server_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  if (port_ <= 0) {
    throw Error("HTTP: cannot listen on " + opt_.host + ":" + std::to_string(opt_.port) +
                " (in use by another process?)");
  }
  // The library listens with a backlog of 5; a burst of clients must wait, not be refused.
  if (listen_fd_ >= 0) ::listen(listen_fd_, kListenBacklog);
  listener_ = std::thread([this] { server_->listen_after_bind(); });
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::stop() {
  if (server_) server_->stop();
  if (listener_.joinable()) listener_.join();
}

bool HttpServer::admit_origin_and_host(const httplib::Request& req, httplib::Response& res) {
  // DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 reaches a loopback
  // server with its own name in Host. Only loopback names are served there.
  if (is_loopback(opt_.host) && req.has_header("Host") &&
      !is_loopback(host_header_name(req.get_header_value("Host")))) {
    send_error(res, error(403,
                          "Host '" + req.get_header_value("Host") +
                              "' is not served here (this server is bound to loopback)",
                          "permission_error"));
    return false;
  }
  if (!req.has_header("Origin")) return true;  // not from a browser page
  const std::string origin = req.get_header_value("Origin");
  // The chat page's own calls: its origin is this server's (scheme and the Host it was loaded
  // from, which on a loopback server was checked to be a loopback name above).
  const std::string self = std::string(opt_.ssl_cert_file.empty() ? "http" : "https") + "://" +
                           req.get_header_value("Host");
  const auto same = [](const std::string& a, const std::string& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) ==
                    std::tolower(static_cast<unsigned char>(y));
           });
  };
  const bool allowed = (opt_.webui && req.has_header("Host") && same(origin, self)) ||
                       std::find(opt_.cors_origins.begin(), opt_.cors_origins.end(), "*") !=
                           opt_.cors_origins.end() ||
                       std::find(opt_.cors_origins.begin(), opt_.cors_origins.end(), origin) !=
                           opt_.cors_origins.end();
  if (!allowed) {
    // Refused before anything runs: a "simple" cross-site POST (text/plain) needs no preflight,
    // so leaving out the CORS headers alone would still let the page start a generation.
    send_error(res, error(403, "Origin '" + origin + "' is not allowed (see --cors-origin)",
                          "permission_error"));
    return false;
  }
  res.set_header("Access-Control-Allow-Origin", origin);
  res.set_header("Vary", "Origin");
  if (req.method == "OPTIONS") {
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
    res.set_header("Access-Control-Max-Age", "600");
  }
  return true;
}

void HttpServer::routes() {
  httplib::Server& s = *server_;
  // Origin, Host and authentication before routing, so no route can forget them; /health stays
  // open for probes, and the chat page loads without the key (its API calls need it).
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!admit_origin_and_host(req, res)) return httplib::Server::HandlerResponse::Handled;
    if (req.method == "OPTIONS") {  // an admitted CORS preflight (it never carries the key)
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool page = opt_.webui && (req.method == "GET" || req.method == "HEAD") &&
                      (req.path == "/" || req.path == "/index.html");
    if (opt_.api_key.empty() || req.path == "/health" || page)
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
    static const std::set<std::string> known = {
        "/health",         "/metrics",  "/v1/models",  "/v1/chat/completions",
        "/v1/completions", "/tokenize", "/detokenize", "/apply-template",
        "/props",          "/slots",    "/",           "/index.html"};
    metrics_.http_response(known.count(req.path) ? req.path : std::string("other"), res.status);
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    engine::Engine* eng = state_.engine.load();
    if (eng == nullptr) {
      send_error(res,
                 error(503, "the model is loading or the server is stopping", "unavailable_error"));
      return;
    }
    // The same probe as gRPC health: a one-token forward between the steps of whatever runs, so
    // a dead or hung worker shows here too.
    const std::string why = eng->probe(kHealthProbeWait);
    if (!why.empty()) {
      send_error(res, error(503, why, "unavailable_error"));
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
  llama_routes();
  if (opt_.webui) add_webui_routes(s);
}

void HttpServer::llama_routes() {
  httplib::Server& s = *server_;
  // Each reads the model's tokenizer or template, which exist once the engine does.
  const auto body_route = [this](auto make) {
    return [this, make](const httplib::Request& req, httplib::Response& res) {
      if (state_.engine.load() == nullptr) {
        send_error(
            res, error(503, "the model is loading or the server is stopping", "unavailable_error"));
        return;
      }
      try {
        res.set_content(dump_lenient(make(parse_json_body(req.body))), "application/json");
      } catch (const HttpError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {  // BadRequest and the tokenizer's errors
        send_error(res, error(400, e.what(), "invalid_request_error"));
      }
    };
  };
  s.Post("/tokenize",
         body_route([this](const json& b) { return tokenize_body(b, *state_.limits.tok); }));
  s.Post("/detokenize",
         body_route([this](const json& b) { return detokenize_body(b, *state_.limits.tok); }));
  s.Post("/apply-template",
         body_route([this](const json& b) { return apply_template_body(b, state_.limits); }));
  s.Get("/props", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_lenient(props_body(facts(), state_.limits)), "application/json");
  });
  s.Get("/slots", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_lenient(slots_body(facts())), "application/json");
  });
  s.Post(R"(/slots/([^/]*))", [this](const httplib::Request& req, httplib::Response& res) {
    engine::Engine* eng = state_.engine.load();
    if (eng == nullptr) {
      send_error(res,
                 error(503, "the model is loading or the server is stopping", "unavailable_error"));
      return;
    }
    try {
      const engine::SlotAction action = slot_action_request(
          req.matches[1].str(), req.get_param_value("action"), req.body, opt_.slot_save_path);
      res.set_content(dump_lenient(slot_action_body(action, eng->slot_action(action))),
                      "application/json");
    } catch (const HttpError& e) {
      send_error(res, e);
    }
  });
}

ServerFacts HttpServer::facts() const {
  ServerFacts f;
  f.model_id = opt_.model_id;
  f.model_path = opt_.model_path;
  f.n_ctx = state_.limits.n_ctx;
  f.kv_cache = state_.kv_cache;
  if (engine::Engine* eng = state_.engine.load()) f.slots = eng->stats().slots;
  return f;
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
    // With --alias the model has a name of its own, and a request for another one is refused
    // (llama-server's behaviour); without it any name is accepted and echoed.
    if (opt_.strict_model && !opts.model.empty() && opts.model != opt_.model_id) {
      throw HttpError(
          404, "model '" + opts.model + "' is not served here (this is '" + opt_.model_id + "')",
          "model", "not_found_error");
    }
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
  const ReplyFormat format =
      state_.limits.tok ? reply_format(state_.limits.tok->vocab()) : ReplyFormat::kQwen;
  const int64_t created = unix_now();
  const std::string model = opts.model.empty() ? opt_.model_id : opts.model;

  const bool want_logprobs = job->request().top_logprobs >= 0;
  const tokenizer::Tokenizer* tok = state_.limits.tok;
  if (!opts.stream) {
    Collected c;
    std::vector<v1::TokenLogprobs> lps;
    const std::unique_ptr<ReplyParser> parser = make_reply_parser(format, reasoning_started, id);
    const PeerSocket peer(req.remote_addr, req.remote_port, req.local_port);
    for (;;) {
      if (peer.closed()) {  // nobody is left to read the answer: free the engine now
        job->cancel();
        return;
      }
      std::optional<engine::JobEvent> ev = job->wait_event(kPoll);
      if (!ev) continue;
      if (ev->kind == engine::JobEvent::Chunk) {
        if (chat) {
          c.all.append(parser->push(ev->text));
        } else {
          c.all.content += ev->text;
        }
        for (const sampling::Logprobs& lp : ev->logprobs) {
          lps.push_back(server::logprobs_to_proto(lp, *tok));
        }
        continue;
      }
      if (ev->kind == engine::JobEvent::Failed) {
        send_error(res, job_error(*ev));
        return;
      }
      if (chat) {
        if (ev->end_token >= 0 && tok != nullptr)
          c.all.append(parser->end_token(tok->token_piece(ev->end_token, true)));
        c.all.append(parser->finish());
      }
      c.prompt_tokens = ev->prompt_tokens;
      c.completion_tokens = ev->completion_tokens;
      c.cached_tokens = ev->cached_tokens;
      c.reason = server::finish_reason_to_proto(ev->reason);
      break;
    }
    const std::string_view reason = finish_reason_name(c.reason, !c.all.tool_calls.empty());
    const Usage usage{c.prompt_tokens, c.completion_tokens, c.cached_tokens};
    json out = chat ? chat_completion(id, created, model, c.all, reason, usage)
                    : text_completion(id, created, model, c.all.content, reason, usage);
    if (want_logprobs) {
      size_t offset = 0;
      out["choices"][0]["logprobs"] = chat ? chat_logprobs(lps) : text_logprobs(lps, offset);
    }
    res.set_content(dump_lenient(out), "application/json");
    return;
  }

  // Streaming: one SSE event per delta, then the finish chunk, usage if asked, and [DONE].
  res.set_header("Cache-Control", "no-cache");
  const std::shared_ptr<ReplyParser> parser = make_reply_parser(format, reasoning_started, id);
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, parser, chat, id, created, model, opts, want_logprobs, tok](size_t,
                                                                        httplib::DataSink& sink) {
        bool first = true;
        size_t tools_sent = 0;
        size_t text_offset = 0;
        auto write = [&](const json& j) {
          const std::string event = sse(j);
          return sink.write(event.data(), event.size());
        };
        // A chunk's tokens' logprobs travel with its delta, even when the text is held back.
        auto send_delta = [&](const ParsedDelta& d, std::span<const v1::TokenLogprobs> lps = {}) {
          if (d.empty() && lps.empty()) return true;
          json j =
              chat ? chat_chunk(id, created, model, chat_delta(d, first, tools_sent), std::nullopt)
                   : text_chunk(id, created, model, d.content, std::nullopt);
          if (!lps.empty()) {
            j["choices"][0]["logprobs"] =
                chat ? chat_logprobs(lps) : text_logprobs(lps, text_offset);
          }
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
            std::vector<v1::TokenLogprobs> lps;
            if (want_logprobs) {
              for (const sampling::Logprobs& lp : ev->logprobs) {
                lps.push_back(server::logprobs_to_proto(lp, *tok));
              }
            }
            if (!send_delta(d, lps)) {
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
          if (chat) {
            if (ev->end_token >= 0 && tok != nullptr)
              send_delta(parser->end_token(tok->token_piece(ev->end_token, true)));
            send_delta(parser->finish());
          }
          const std::string_view reason =
              finish_reason_name(server::finish_reason_to_proto(ev->reason), tools_sent > 0);
          write(chat ? chat_chunk(id, created, model, chat_delta(ParsedDelta{}, first, tools_sent),
                                  reason)
                     : text_chunk(id, created, model, "", reason));
          if (opts.include_usage) {
            const Usage usage{ev->prompt_tokens, ev->completion_tokens, ev->cached_tokens};
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
