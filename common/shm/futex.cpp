#include "common/shm/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"

namespace moe::shm {
namespace {

long futex(std::atomic<uint32_t>& word, int op, uint32_t val, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), op, val, timeout, nullptr, 0);
}

}  // namespace

void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(secs.count());
  ts.tv_nsec = static_cast<long>((timeout - secs).count());
  if (futex(word, FUTEX_WAIT, expected, &ts) == 0) return;
  const int err = errno;
  if (err == EAGAIN || err == ETIMEDOUT || err == EINTR) return;
  throw Error(std::string("futex wait failed: ") + std::strerror(err));
}

void futex_wake(std::atomic<uint32_t>& word, int count) {
  if (futex(word, FUTEX_WAKE, static_cast<uint32_t>(count), nullptr) < 0) {
    throw Error(std::string("futex wake failed: ") + std::strerror(errno));
  }
}

}  // namespace moe::shm
