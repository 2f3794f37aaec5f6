// Runs the real moe-coordinator (and through it moe-cpu-worker) as a child process for the
// multi-process tests: any free port, a ready file to know when it serves, stubs for every
// service, and checks that nothing (process or shared-memory segment) is left behind.
#pragma once

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/child_process.h"
#include "cpu_worker/process_watch.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "moe/v1/control.grpc.pb.h"
#include "moe/v1/generation.grpc.pb.h"

namespace moe::test {

inline const std::string kBinDir = MOE_BIN_DIR;

inline std::chrono::system_clock::time_point in(std::chrono::milliseconds d) {
  return std::chrono::system_clock::now() + d;
}

// /dev/shm entries whose name carries `pid` as the creator (run_segment_name's "moe-<pid>-").
inline std::vector<std::string> segments_of(pid_t pid) {
  std::vector<std::string> out;
  const std::string prefix = "moe-" + std::to_string(pid) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

// A generation that runs for seconds: the whole context, end-of-generation ignored.
inline v1::GenerateRequest long_request() {
  v1::GenerateRequest r;
  r.set_text("Count forever:");
  r.set_ignore_eos(true);
  r.set_seed(1);
  return r;
}

// True once `f` holds, polled every 5 ms; false when `limit` passed first.
inline bool wait_until(const std::function<bool()>& f, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!f()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// True once `pid` is gone (a zombie counts as gone: its parent may be a reaper-less init).
inline bool gone_within(pid_t pid, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    bool alive = false;
    try {
      alive = worker::ProcessWatch(pid).alive();
    } catch (const std::exception&) {
      alive = false;
    }
    if (!alive) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

class Coordinator {
 public:
  // Starts moe-coordinator on `model` with `args` and waits until it serves (fails the test via
  // an exception otherwise).
  Coordinator(const std::string& model, std::vector<std::string> args) {
    ready_ = (std::filesystem::temp_directory_path() /
              ("moe_coord_ready_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++)))
                 .string();
    std::filesystem::remove(ready_);
    std::vector<std::string> argv = {
        kBinDir + "/moe-coordinator", "-m", model, "--port", "0", "--ready-file", ready_};
    argv.insert(argv.end(), args.begin(), args.end());
    proc_ = model::ChildProcess::spawn(argv);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!std::filesystem::exists(ready_)) {
      if (!proc_.running()) throw std::runtime_error("moe-coordinator " + proc_.describe());
      if (std::chrono::steady_clock::now() > end) throw std::runtime_error("coordinator not ready");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::ifstream f(ready_);
    std::getline(f, addr_);
    std::string line;
    if (std::getline(f, line) && line.rfind("http ", 0) == 0) http_addr_ = line.substr(5);
    channel_ = grpc::CreateChannel(addr_, grpc::InsecureChannelCredentials());
    gen = v1::Generation::NewStub(channel_);
    control = v1::Control::NewStub(channel_);
    health = grpc::health::v1::Health::NewStub(channel_);
  }

  ~Coordinator() { stop(); }

  // SIGTERM and wait; true when it exited with status 0 within 10 s.
  bool stop() {
    if (proc_.exited() || proc_.pid() <= 0) return proc_.exit_code() == 0;
    ::kill(proc_.pid(), SIGTERM);
    if (!proc_.wait_for(std::chrono::seconds(10))) {
      proc_.kill();
      return false;
    }
    std::filesystem::remove(ready_);
    return proc_.exit_code() == 0;
  }

  model::ChildProcess& process() { return proc_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  pid_t pid() const { return proc_.pid(); }
  const std::string& addr() const { return addr_; }
  const std::string& http_addr() const { return http_addr_; }  // empty: HTTP off

  v1::GetPlacementResponse placement() {
    grpc::ClientContext ctx;
    ctx.set_deadline(in(std::chrono::seconds(5)));
    v1::GetPlacementResponse r;
    const grpc::Status st = control->GetPlacement(&ctx, {}, &r);
    if (!st.ok()) throw std::runtime_error("GetPlacement: " + st.error_message());
    return r;
  }

  v1::GetStatsResponse stats() {
    grpc::ClientContext ctx;
    ctx.set_deadline(in(std::chrono::seconds(5)));
    v1::GetStatsResponse r;
    const grpc::Status st = control->GetStats(&ctx, {}, &r);
    if (!st.ok()) throw std::runtime_error("GetStats: " + st.error_message());
    return r;
  }

  std::unique_ptr<v1::Generation::Stub> gen;
  std::unique_ptr<v1::Control::Stub> control;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  model::ChildProcess proc_;
  std::string ready_, addr_, http_addr_;
  std::shared_ptr<grpc::Channel> channel_;
};

// The outcome of one streamed Generate.
struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  bool finished = false;
  v1::Finish finish;
  int chunks = 0;
  std::vector<v1::TokenLogprobs> logprobs;
};

// Reads a Generate stream to its end; `on_chunk` (optional) sees each chunk and may cancel.
template <typename OnChunk>
StreamResult run_stream(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
                        grpc::ClientContext& ctx, OnChunk on_chunk) {
  StreamResult r;
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) {
      ++r.chunks;
      for (int32_t t : resp.chunk().token_ids()) r.tokens.push_back(t);
      r.text += resp.chunk().text();
      for (const v1::TokenLogprobs& lp : resp.chunk().logprobs()) r.logprobs.push_back(lp);
      on_chunk(r);
    } else if (resp.has_finish()) {
      r.finished = true;
      r.finish = resp.finish();
    }
  }
  r.status = reader->Finish();
  return r;
}

inline StreamResult run_stream(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
                               std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(in(deadline));
  return run_stream(stub, req, ctx, [](const StreamResult&) {});
}

// The prompt's token ids from the coordinator's own tokenizer (gRPC Tokenize).
inline std::vector<int32_t> tokenize(Coordinator& c, const std::string& text) {
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(10)));
  v1::TokenizeRequest req;
  req.set_text(text);
  v1::TokenizeResponse resp;
  const grpc::Status st = c.gen->Tokenize(&ctx, req, &resp);
  if (!st.ok()) throw std::runtime_error("Tokenize: " + st.error_message());
  return {resp.ids().begin(), resp.ids().end()};
}

// A greedy request (temperature 0) for `prompt` that ignores end-of-generation tokens, so it
// produces exactly max_tokens.
inline v1::GenerateRequest greedy(const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest req;
  for (int32_t t : prompt) req.mutable_tokens()->add_ids(t);
  req.set_max_tokens(max_tokens);
  req.mutable_sampling()->set_temperature(0.0f);
  req.set_ignore_eos(true);
  return req;
}

}  // namespace moe::test
