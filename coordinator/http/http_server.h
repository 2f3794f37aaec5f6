// The OpenAI-compatible HTTP API (llama-server's behaviour) over the same engine as gRPC:
// POST /v1/chat/completions and /v1/completions (streamed as server-sent events ending in
// `data: [DONE]`, or whole), GET /v1/models, /health and /metrics, and llama-server's /tokenize,
// /detokenize, /apply-template, /props, /slots and POST /slots/{id} (llama_routes.h). Errors are
// JSON bodies ({"error": {...}}) with 400 (bad request), 401 (API key), 403 (an Origin not
// allowed, or a Host that is not loopback's on a loopback server: DNS rebinding), 404, 409 (a busy
// slot), 413 (body too large), 429 (queue full), 501 (slot files without --slot-save-path) and 503
// (starting, stopping, draining or a worker died). GET / (and /index.html) is the built-in chat
// page (webui_route.h; --no-webui turns it off), open without the API key.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/engine/worker_registry.h"
#include "coordinator/http/llama_routes.h"
#include "coordinator/http/metrics.h"
#include "coordinator/server/serving_state.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace moe::http {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  // Required (Authorization: Bearer KEY) on every route but /health and the chat page;
  // mandatory when `host` is not a loopback address.
  std::string api_key;
  size_t max_body_bytes = 8u << 20;
  // Connections served at once (a thread each, started as needed); more wait for a free one.
  int threads = 256;
  // Origins (scheme://host[:port]) whose pages may call the API, or "*" for any. A request that
  // carries any other Origin is refused (403), so a web page a user opens cannot drive the server;
  // the server's own origin (the chat page's: scheme and the request's Host) is always allowed.
  std::vector<std::string> cors_origins;
  // PEM files: HTTPS instead of HTTP when both are set.
  std::string ssl_cert_file, ssl_key_file;
  std::string model_id = "moe-runtime";
  bool strict_model = false;  // --alias: a request naming another model gets 404
  std::string model_path;     // /props
  bool webui = true;          // the chat page at GET / (--no-webui: 404)
  // --slot-save-path: the folder of POST /slots/{id}'s files; empty: that route answers 501.
  std::string slot_save_path;
};

class HttpServer {
 public:
  // Binds and starts serving on a thread of its own; throws moe::Error when the port cannot be
  // bound or a non-loopback address has no API key.
  HttpServer(HttpOptions opt, server::ServingState& state, engine::WorkerRegistry& registry,
             Metrics& metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  // Stops accepting and ends the listener (open streams end as their jobs fail).
  void stop();

 private:
  void routes();
  // POST /tokenize, /detokenize, /apply-template, /slots/{id}; GET /props, /slots (llama-server's).
  void llama_routes();
  ServerFacts facts() const;
  // Refuses (403, and false) a request from an Origin not allowed, or with a non-loopback Host on
  // a loopback server; sets the CORS headers of an allowed one.
  bool admit_origin_and_host(const httplib::Request& req, httplib::Response& res);
  // POST /v1/chat/completions (chat) and /v1/completions.
  void generation(const httplib::Request& req, httplib::Response& res, bool chat);

  HttpOptions opt_;
  server::ServingState& state_;
  engine::WorkerRegistry& registry_;
  Metrics& metrics_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  int listen_fd_ = -1;
  std::thread listener_;
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback(const std::string& host);

// The host part of a Host header ("[::1]:8080" -> "::1", "localhost:80" -> "localhost").
std::string host_header_name(const std::string& header);

}  // namespace moe::http
