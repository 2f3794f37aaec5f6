// Cross-process futex wait/wake on a 32-bit word in shared memory, and the spin-loop pause.
// The calls deliberately omit FUTEX_PRIVATE_FLAG: a private futex is keyed by (mm, address) and
// would never match a waiter in another process; a shared one is keyed by the backing page.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace moe::shm {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the futex word must be a plain 32-bit integer");

// Sleeps while *word == expected, at most `timeout` (relative, CLOCK_MONOTONIC). Returns on wake,
// timeout, signal or value mismatch alike: callers always re-check their condition. Throws
// moe::Error for real failures (EFAULT, EINVAL, ENOSYS).
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::nanoseconds timeout);

// Wakes up to `count` waiters on `word`.
void futex_wake(std::atomic<uint32_t>& word, int count);

// Tells the CPU we are spinning (frees pipeline resources for the sibling hyperthread).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace moe::shm
