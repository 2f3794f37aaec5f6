#include "coordinator/http/connection_pool.h"

#include <chrono>
#include <thread>

namespace moe::http {

namespace {
// A thread with no connection for this long exits; a burst's threads do not stay forever.
constexpr std::chrono::seconds kIdleExit{30};
}  // namespace

ConnectionPool::ConnectionPool(size_t max_threads)
    : max_threads_(max_threads == 0 ? 1 : max_threads) {}

ConnectionPool::~ConnectionPool() { shutdown(); }

void ConnectionPool::enqueue(std::function<void()> fn) {
  std::unique_lock lock(mu_);
  queue_.push_back(std::move(fn));
  if (idle_ >= queue_.size() || threads_ >= max_threads_) {
    cv_.notify_one();
    return;
  }
  ++threads_;
  // Detached: shutdown() waits for the count to reach zero instead of joining handles, so a
  // thread that exits when idle leaves nothing behind to join.
  std::thread([this] { worker(); }).detach();
}

void ConnectionPool::worker() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (queue_.empty()) {
      if (stopping_) break;
      ++idle_;
      const bool woken =
          cv_.wait_for(lock, kIdleExit, [this] { return stopping_ || !queue_.empty(); });
      --idle_;
      if (!woken) break;
      continue;
    }
    std::function<void()> fn = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
  --threads_;
  exited_.notify_all();
}

void ConnectionPool::shutdown() {
  std::unique_lock lock(mu_);
  stopping_ = true;
  cv_.notify_all();
  exited_.wait(lock, [this] { return threads_ == 0; });
}

size_t ConnectionPool::threads() const {
  std::lock_guard lock(mu_);
  return threads_;
}

}  // namespace moe::http
