// Named POSIX shared-memory segments (Boost.Interprocess), mapped read-write.
// POSIX shm has kernel persistence: a segment outlives a crashed creator until its name is
// unlinked, hence the creator-removes RAII rule and remove_stale_segments() for crash leftovers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace moe::shm {

class ShmSegment {
 public:
  // Creates `name` ("/something", no other '/') of `bytes` bytes, zero-filled, mode 0600, with
  // its pages reserved up front (a full /dev/shm is an error here, not a SIGBUS later). Throws
  // moe::Error when the name exists or anything fails; nothing is left behind on failure.
  static ShmSegment create(std::string_view name, size_t bytes);
  // Maps an existing segment at its current size. Throws moe::Error when missing or empty.
  static ShmSegment open(std::string_view name);

  ShmSegment(ShmSegment&&) noexcept;
  ShmSegment& operator=(ShmSegment&&) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();  // unmaps; the creator also unlinks the name

  void* data() const;  // 4 KiB-aligned (page-aligned mapping); nullptr after a move
  size_t size() const;
  const std::string& name() const;
  bool owner() const;  // true for the creator: the name goes away with this object

 private:
  struct Impl;
  explicit ShmSegment(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "/moe-<pid>-<role>": names carry the creator's pid so that remove_stale_segments() can tell a
// crashed run's leftovers from a live run's segments. `role` is [A-Za-z0-9_.-]+, at most 200 chars.
std::string run_segment_name(std::string_view role);

// Unlinks `name` (mappings stay valid); false when it did not exist. For a worker whose creator
// died without removing it.
bool remove_segment(std::string_view name);

// Unlinks every /dev/shm entry named "<prefix><pid>-..." whose pid no longer exists
// (kill(pid, 0) fails with ESRCH) and returns how many were removed. Throws moe::Error when
// /dev/shm cannot be read or a stale entry cannot be unlinked (other than a racing remover).
size_t remove_stale_segments(std::string_view prefix = "moe-");

}  // namespace moe::shm
