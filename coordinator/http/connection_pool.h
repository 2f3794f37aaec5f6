// The threads that serve HTTP connections. cpp-httplib serves each connection on one thread for
// its whole life (an idle keep-alive connection or a client sending its headers byte by byte holds
// one), and its fixed pool queues every connection past the pool's size: 32 idle sockets were
// enough to keep /health from answering. This pool grows a thread for each connection up to a
// large cap and lets idle threads go, so an idle or slow client costs one parked thread, not the
// server.
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

namespace moe::http {

class ConnectionPool final : public httplib::TaskQueue {
 public:
  // At most `max_threads` connections are served at once; later ones wait in order.
  explicit ConnectionPool(size_t max_threads);
  ~ConnectionPool() override;
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  void enqueue(std::function<void()> fn) override;
  // Runs what is queued, then joins every thread.
  void shutdown() override;

  size_t threads() const;

 private:
  void worker();

  const size_t max_threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_, exited_;
  std::deque<std::function<void()>> queue_;
  size_t threads_ = 0, idle_ = 0;
  bool stopping_ = false;
};

}  // namespace moe::http
