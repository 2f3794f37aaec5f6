// Whether a process that is not our child (the coordinator) still lives. kill(pid, 0) alone is
// not enough: it succeeds for a zombie -- a dead coordinator whose parent has not reaped it yet --
// and for a recycled pid. /proc/<pid>/stat gives the state and the start time, which tell both.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace moe::worker {

class ProcessWatch {
 public:
  // Throws moe::Error when `pid` is not a live process now.
  explicit ProcessWatch(pid_t pid);

  pid_t pid() const { return pid_; }
  // False once the process has exited (zombie included) or its pid names another process.
  bool alive() const;

 private:
  pid_t pid_;
  uint64_t start_time_ = 0;  // /proc/<pid>/stat field 22; 0 when /proc is unavailable
};

}  // namespace moe::worker
