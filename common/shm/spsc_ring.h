// Single-producer/single-consumer ring of fixed-size slots placed inside shared memory, for the
// coordinator -> worker data path. The shared part holds integers and atomics only (no pointers),
// so each process may map it at a different address. No locks: a process that dies mid-call
// leaves nothing locked, and a blocked peer gives up on timeout, stop flag or liveness callback.
//
// Index discipline as folly's ProducerConsumerQueue: each side keeps its own index privately and
// publishes it with a release store; it reads the peer's index with acquire, and only when its
// cached copy says full/empty, so the peer's cache line is not pulled over on every call.
// head/tail are free-running 64-bit counters (slot = index & (capacity - 1)): all `capacity`
// slots are usable and the counters cannot wrap in practice.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

#include "common/shm/futex.h"

namespace moe::shm {

inline constexpr uint64_t kRingMagic = 0x31474e4952454f4dULL;  // "MOERING1" in memory order
inline constexpr uint32_t kRingVersion = 1;
inline constexpr size_t kCacheLine = 64;
inline constexpr uint32_t kMaxRingSlotSize = 1u << 20;  // bulk data belongs in a side buffer
inline constexpr uint32_t kMaxRingCapacity = 1u << 24;
inline constexpr uint32_t kDefaultSpin = 2000;  // ~tens of µs of pause before sleeping

// The shared header; slots follow at offset sizeof(RingHeader). Fields written by one side only
// sit on their own cache lines so the two sides never write the same line on the fast path.
struct RingHeader {
  std::atomic<uint64_t> magic;  // stored last by format(): a half-written header is rejected
  uint32_t version;
  uint32_t slot_size;
  uint32_t capacity;  // power of two
  uint32_t reserved;
  // Header + slots, rounded up to a cache line.
  uint64_t total_bytes;
  alignas(kCacheLine) std::atomic<uint64_t> head;  // slots pushed so far; producer writes
  alignas(kCacheLine) std::atomic<uint64_t> tail;  // slots popped so far; consumer writes
  // Sleeping: `*_seq` is the futex word, `*_waiting` tells the other side to wake it. The fast
  // path only reads the flag, so it needs no syscall while nobody sleeps.
  alignas(kCacheLine) std::atomic<uint32_t> data_seq;  // consumer waits here for data
  std::atomic<uint32_t> consumer_waiting;
  alignas(kCacheLine) std::atomic<uint32_t> space_seq;  // producer waits here for space
  std::atomic<uint32_t> producer_waiting;
  // CLOCK_MONOTONIC nanoseconds (system-wide, so comparable across processes); 0 = never.
  alignas(kCacheLine) std::atomic<uint64_t> producer_heartbeat;
  alignas(kCacheLine) std::atomic<uint64_t> consumer_heartbeat;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::is_standard_layout_v<RingHeader>);
static_assert(offsetof(RingHeader, tail) - offsetof(RingHeader, head) >= kCacheLine);
static_assert(offsetof(RingHeader, data_seq) - offsetof(RingHeader, tail) >= kCacheLine);
static_assert(offsetof(RingHeader, head) % kCacheLine == 0 &&
              offsetof(RingHeader, tail) % kCacheLine == 0);
static_assert(sizeof(RingHeader) % kCacheLine == 0);

enum class Side { Producer, Consumer };
enum class WaitStatus { Ok, Timeout, PeerDead, Stopped };
const char* to_string(WaitStatus s);

// How a blocking call waits: spin, then sleep on the futex in slices of at most `poll`, checking
// `stop` and `peer_alive` between slices, until `timeout` has passed. A dead peer can never wake
// the sleeper, so `poll` bounds how late its death is noticed.
struct WaitOptions {
  std::chrono::nanoseconds timeout = std::chrono::seconds(1);
  uint32_t spin = kDefaultSpin;
  std::chrono::nanoseconds poll = std::chrono::milliseconds(10);
  const std::atomic<bool>* stop = nullptr;  // set -> Stopped (call SpscRing::wake_all after)
  std::function<bool()> peer_alive;         // returns false -> PeerDead; empty: assume alive
};

// A validated view of a ring in memory; cheap to copy. Capacity and slot size are kept here, not
// re-read from shared memory, so a peer scribbling on the header cannot cause out-of-bounds use.
class SpscRing {
 public:
  // Bytes the ring occupies (a multiple of 64, so rings can be packed back to back).
  // Throws moe::Error when capacity is not a power of two or a size is out of range.
  static size_t required_bytes(uint32_t capacity, uint32_t slot_size);
  // Initializes a new, empty ring at `mem` (64-byte aligned, `bytes` long). Before any peer
  // attaches: format is not safe against a concurrent attach().
  static SpscRing format(void* mem, size_t bytes, uint32_t capacity, uint32_t slot_size);
  // Checks magic, version, capacity, slot size (must equal `slot_size`) and that the ring fits
  // `bytes`; throws moe::Error naming the first bad field.
  static SpscRing attach(void* mem, size_t bytes, uint32_t slot_size);

  uint32_t capacity() const { return capacity_; }
  uint32_t slot_size() const { return slot_size_; }
  size_t size_guess() const;  // items queued; exact only when both sides are quiet

  void heartbeat(Side side);  // records "now" as this side's heartbeat
  std::chrono::steady_clock::time_point last_heartbeat(Side side) const;  // epoch: never
  void wake_all();  // wakes both sides' sleepers, e.g. after setting a stop flag

  RingHeader* header() const { return header_; }
  std::byte* slot(uint64_t index) const {
    return slots_ + (index & (capacity_ - 1)) * size_t{slot_size_};
  }

 private:
  SpscRing(RingHeader* header, uint32_t capacity, uint32_t slot_size);
  RingHeader* header_;
  std::byte* slots_;
  uint32_t capacity_;
  uint32_t slot_size_;
};

[[noreturn]] void throw_slot_size_mismatch(size_t got, uint32_t slot_size);
[[noreturn]] void throw_ring_corrupt(const char* side, uint64_t head, uint64_t tail);

// The one producer of a ring. Not thread-safe; one instance per ring.
class RingProducer {
 public:
  explicit RingProducer(const SpscRing& ring);

  // Copies `n` (== slot_size) bytes into the next slot; false when the ring is full.
  bool try_push(const void* src, size_t n) {
    if (n != ring_.slot_size()) throw_slot_size_mismatch(n, ring_.slot_size());
    RingHeader& h = *ring_.header();
    if (head_ - cached_tail_ >= ring_.capacity()) {
      cached_tail_ = h.tail.load(std::memory_order_acquire);  // slot contents read by consumer
      if (cached_tail_ > head_) throw_ring_corrupt("producer", head_, cached_tail_);
      if (head_ - cached_tail_ >= ring_.capacity()) return false;
    }
    std::memcpy(ring_.slot(head_), src, n);
    h.head.store(++head_, std::memory_order_release);
    // Pairs with the consumer's fence between raising its flag and re-checking head: one of
    // the two sees the other's store, so a sleeper is never missed.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (h.consumer_waiting.load(std::memory_order_relaxed) != 0) wake_consumer();
    return true;
  }
  template <typename T>
  bool try_push(const T& item) {
    static_assert(std::is_trivially_copyable_v<T>, "ring items are copied bytewise");
    static_assert(!std::is_pointer_v<T>, "a pointer means nothing in the other process");
    return try_push(&item, sizeof(T));
  }

  // Spins, then sleeps until there is space, the timeout passes, stop is set or the peer died.
  WaitStatus push(const void* src, size_t n, const WaitOptions& opt);

  void heartbeat() { ring_.heartbeat(Side::Producer); }
  const SpscRing& ring() const { return ring_; }

 private:
  void wake_consumer();
  SpscRing ring_;
  uint64_t head_;         // own index, private copy of header.head
  uint64_t cached_tail_;  // last tail seen
};

// The one consumer of a ring. Not thread-safe; one instance per ring.
class RingConsumer {
 public:
  explicit RingConsumer(const SpscRing& ring);

  // Copies the oldest slot into `dst` (`n` == slot_size bytes); false when the ring is empty.
  bool try_pop(void* dst, size_t n) {
    if (n != ring_.slot_size()) throw_slot_size_mismatch(n, ring_.slot_size());
    RingHeader& h = *ring_.header();
    if (cached_head_ == tail_) {
      cached_head_ = h.head.load(std::memory_order_acquire);  // slot contents written before
      if (cached_head_ - tail_ > ring_.capacity())
        throw_ring_corrupt("consumer", cached_head_, tail_);
      if (cached_head_ == tail_) return false;
    }
    std::memcpy(dst, ring_.slot(tail_), n);
    h.tail.store(++tail_, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);  // as in try_push
    if (h.producer_waiting.load(std::memory_order_relaxed) != 0) wake_producer();
    return true;
  }
  template <typename T>
  bool try_pop(T& item) {
    static_assert(std::is_trivially_copyable_v<T>, "ring items are copied bytewise");
    static_assert(!std::is_pointer_v<T>, "a pointer means nothing in the other process");
    return try_pop(&item, sizeof(T));
  }

  // Spins, then sleeps until an item arrives, the timeout passes, stop is set or the peer died.
  WaitStatus pop(void* dst, size_t n, const WaitOptions& opt);

  void heartbeat() { ring_.heartbeat(Side::Consumer); }
  const SpscRing& ring() const { return ring_; }

 private:
  void wake_producer();
  SpscRing ring_;
  uint64_t tail_;         // own index, private copy of header.tail
  uint64_t cached_head_;  // last head seen
};

}  // namespace moe::shm
