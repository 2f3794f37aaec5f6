#include "coordinator/cli/interrupt.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"

namespace moe::cli {

namespace {

constexpr char kInterrupt = 'i';
constexpr char kQuit = 'q';

// The pipe's write end, set before the handler is installed and cleared after it is removed.
int g_write_fd = -1;
struct sigaction g_previous;

extern "C" void on_sigint(int) {
  const int saved = errno;
  const char byte = kInterrupt;
  if (write(g_write_fd, &byte, 1) < 0) {
    // Nothing to do: a full pipe already holds an interrupt.
  }
  errno = saved;
}

[[noreturn]] void fail(const std::string& what) {
  throw moe::Error(what + ": " + std::strerror(errno));
}

}  // namespace

InterruptGuard::InterruptGuard() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) fail("SIGINT pipe");
  read_fd_ = fds[0];
  g_write_fd = fds[1];
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(SIGINT, &sa, &g_previous) != 0) {
    close(read_fd_);
    close(g_write_fd);
    g_write_fd = -1;
    fail("SIGINT handler");
  }
  watcher_ = std::thread([this] { run_watcher(); });
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &g_previous, nullptr);
  const char byte = kQuit;
  while (write(g_write_fd, &byte, 1) < 0 && errno == EINTR) {
  }
  watcher_.join();
  close(read_fd_);
  close(g_write_fd);
  g_write_fd = -1;
}

void InterruptGuard::watch(grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  ctx_ = ctx;
  if (ctx_ != nullptr && interrupted_.load()) ctx_->TryCancel();
}

void InterruptGuard::run_watcher() {
  for (;;) {
    char byte = 0;
    const ssize_t n = read(read_fd_, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || byte == kQuit) return;
    interrupted_.store(true);
    std::lock_guard<std::mutex> lock(mu_);
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
}

}  // namespace moe::cli
