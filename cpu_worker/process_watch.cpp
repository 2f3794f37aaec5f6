#include "cpu_worker/process_watch.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "common/error.h"

namespace moe::worker {
namespace {

struct ProcStat {
  char state = '?';
  uint64_t start_time = 0;
};

// Parses /proc/<pid>/stat; nullopt when it cannot be read (process gone, or no /proc).
std::optional<ProcStat> read_stat(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[1024];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  // "pid (comm) S ppid ...": comm may hold spaces and parentheses, so parse after the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (!p || p[1] != ' ') return std::nullopt;
  ProcStat st;
  st.state = p[2];
  // Walk from field 3 (state) to field 22 (starttime).
  const char* f = p + 2;
  for (int field = 3; field < 22 && f; ++field) {
    f = std::strchr(f, ' ');
    if (f) ++f;
  }
  if (!f) return std::nullopt;
  st.start_time = std::strtoull(f, nullptr, 10);
  return st;
}

}  // namespace

ProcessWatch::ProcessWatch(pid_t pid) : pid_(pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH)) {
    throw Error("process " + std::to_string(pid) + " does not exist");
  }
  const auto st = read_stat(pid);
  if (st && (st->state == 'Z' || st->state == 'X')) {
    throw Error("process " + std::to_string(pid) + " has already exited");
  }
  if (st) start_time_ = st->start_time;
}

bool ProcessWatch::alive() const {
  // EPERM means it exists (another user's); only ESRCH proves it is gone.
  if (::kill(pid_, 0) != 0 && errno == ESRCH) return false;
  if (start_time_ == 0) return true;  // no /proc: kill(pid, 0) is all we have
  const auto st = read_stat(pid_);
  return st && st->state != 'Z' && st->state != 'X' && st->start_time == start_time_;
}

}  // namespace moe::worker
