#include "common/child_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "common/error.h"

extern char** environ;

namespace moe::model {
namespace {

// RAII for the spawn attribute object.
struct SpawnAttr {
  posix_spawnattr_t attr;
  SpawnAttr() { posix_spawnattr_init(&attr); }
  ~SpawnAttr() { posix_spawnattr_destroy(&attr); }
};

}  // namespace

ChildProcess ChildProcess::spawn(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0].empty()) throw Error("cannot start a process: empty command");
  // Built before spawning: nothing is allocated between clone and exec.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // A coordinator may block or ignore signals (SIGPIPE, SIGINT); the worker starts clean.
  SpawnAttr sa;
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&sa.attr, &none);
  posix_spawnattr_setsigdefault(&sa.attr, &all);
  posix_spawnattr_setflags(&sa.attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  // glibc reports exec failures (ENOENT, EACCES, ...) here and reaps the failed child itself.
  const int rc = posix_spawn(&pid, args[0], nullptr, &sa.attr, args.data(), environ);
  if (rc != 0) {
    throw Error("cannot start '" + argv[0] + "': " + std::strerror(rc));
  }
  ChildProcess p;
  p.pid_ = pid;
  return p;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), reaped_(other.reaped_), status_(other.status_) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    release();
    pid_ = std::exchange(other.pid_, -1);
    reaped_ = other.reaped_;
    status_ = other.status_;
  }
  return *this;
}

ChildProcess::~ChildProcess() { release(); }

void ChildProcess::release() {
  kill();
  pid_ = -1;
  reaped_ = false;
}

void ChildProcess::reap(bool block) {
  if (pid_ <= 0 || reaped_) return;
  int st = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &st, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    reaped_ = true;
    status_ = st;
  } else if (r < 0) {
    // ECHILD: someone else reaped it (SIGCHLD ignored, or a foreign waitpid(-1)); it is gone.
    reaped_ = true;
    status_ = -1;
  }
}

bool ChildProcess::running() {
  reap(false);
  return pid_ > 0 && !reaped_;
}

bool ChildProcess::wait_for(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

void ChildProcess::kill() {
  if (!running()) return;
  ::kill(pid_, SIGKILL);
  reap(true);
}

int ChildProcess::exit_code() const {
  return reaped_ && status_ != -1 && WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
}

std::string ChildProcess::describe() const {
  if (pid_ <= 0) return "not started";
  if (!reaped_) return "running";
  if (status_ == -1) return "exited (status unknown: reaped elsewhere)";
  if (WIFEXITED(status_)) return "exited with status " + std::to_string(WEXITSTATUS(status_));
  if (WIFSIGNALED(status_)) {
    const int sig = WTERMSIG(status_);
    return "killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "stopped";
}

}  // namespace moe::model
