// A child process owned by one object: started with posix_spawn, watched with waitpid(WNOHANG),
// and killed (SIGKILL) and reaped by the destructor if it still runs, so no path leaks a process
// or leaves a zombie.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace moe::model {

class ChildProcess {
 public:
  ChildProcess() = default;  // no process
  // Runs argv[0] (a path; PATH is not searched) with `argv`, inheriting stdin/stdout/stderr and
  // the environment, with every signal at its default action and none blocked. posix_spawn
  // instead of fork: nothing of the parent runs in the child before exec (safe with threads) and
  // the parent's page tables are not copied. Callers still spawn before initializing CUDA
  // (DESIGN.md §2). Throws moe::Error when the program cannot be executed (missing, not
  // executable), with the path and the reason.
  static ChildProcess spawn(const std::vector<std::string>& argv);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  // True while the child runs. Once it has exited it is reaped and its status kept.
  bool running();
  // Waits up to `timeout` for the child to exit; true when it has (and is reaped).
  bool wait_for(std::chrono::milliseconds timeout);
  // SIGKILL and a blocking reap; nothing when it has already exited.
  void kill();
  // "exited with status 1", "killed by signal 9 (Killed)", "running", "not started".
  std::string describe() const;
  bool exited() const { return reaped_; }
  int exit_code() const;  // the exit status, or -1 when killed by a signal or still running

 private:
  void reap(bool block);
  void release();

  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;  // from waitpid, valid once reaped_
};

}  // namespace moe::model
