// SIGINT while a streaming call runs cancels it. The signal handler only writes one byte to a pipe
// (async-signal-safe); a watcher thread reads it and calls ClientContext::TryCancel, which is not
// safe to call from a handler. Outside an InterruptGuard SIGINT keeps its previous action (the
// default ends the process, e.g. while chat waits for a line).
#pragma once

#include <grpcpp/client_context.h>

#include <atomic>
#include <mutex>
#include <thread>

namespace moe::cli {

// At most one exists at a time.
class InterruptGuard {
 public:
  // Installs the SIGINT handler and starts the watcher thread; throws moe::Error when the pipe or
  // the handler cannot be set up.
  InterruptGuard();
  // Restores the previous SIGINT action and stops the watcher.
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  // The call SIGINT cancels from now on (nullptr: none). A SIGINT that came earlier cancels `ctx`
  // at once. The context must stay alive until it is replaced.
  void watch(grpc::ClientContext* ctx);
  // True once SIGINT arrived.
  bool interrupted() const { return interrupted_.load(); }

 private:
  void run_watcher();

  int read_fd_ = -1;
  std::atomic<bool> interrupted_{false};
  std::mutex mu_;
  grpc::ClientContext* ctx_ = nullptr;  // guarded by mu_
  std::thread watcher_;
};

// Clears the watched context when it goes out of scope, before the context it was given.
class ScopedWatch {
 public:
  ScopedWatch(InterruptGuard& guard, grpc::ClientContext& ctx) : guard_(guard) {
    guard_.watch(&ctx);
  }
  ~ScopedWatch() { guard_.watch(nullptr); }
  ScopedWatch(const ScopedWatch&) = delete;
  ScopedWatch& operator=(const ScopedWatch&) = delete;

 private:
  InterruptGuard& guard_;
};

}  // namespace moe::cli
