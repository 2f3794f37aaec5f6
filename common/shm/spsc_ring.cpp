#include "common/shm/spsc_ring.h"

#include <algorithm>
#include <limits>
#include <new>
#include <string>

#include "common/checked_math.h"
#include "common/error.h"

namespace moe::shm {
namespace {

using Clock = std::chrono::steady_clock;

bool is_pow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// Header + slots, rounded to a cache line; nullopt on overflow.
std::optional<uint64_t> ring_bytes(uint64_t capacity, uint64_t slot_size) {
  const auto slots = checked_mul(capacity, slot_size);
  if (!slots) return std::nullopt;
  const auto total = checked_add(sizeof(RingHeader), *slots);
  if (!total) return std::nullopt;
  return checked_align_up(*total, kCacheLine);
}

std::string ring_error(const std::string& what) { return "shared-memory ring: " + what; }

void check_placement(const void* mem, size_t bytes) {
  if (mem == nullptr) throw Error(ring_error("null memory"));
  if (reinterpret_cast<uintptr_t>(mem) % kCacheLine != 0) {
    throw Error(ring_error("memory is not 64-byte aligned"));
  }
  if (bytes < sizeof(RingHeader)) {
    throw Error(ring_error(std::to_string(bytes) + " bytes cannot hold the " +
                           std::to_string(sizeof(RingHeader)) + "-byte header"));
  }
}

std::atomic<uint64_t>& heartbeat_word(RingHeader& h, Side side) {
  return side == Side::Producer ? h.producer_heartbeat : h.consumer_heartbeat;
}

// The slow path shared by push and pop: spin on try_once, then announce ourselves in `waiting`
// and sleep on `seq` until the peer bumps it, in slices so that stop/liveness are noticed.
template <typename TryOnce>
WaitStatus wait_until(TryOnce&& try_once, std::atomic<uint32_t>& seq,
                      std::atomic<uint32_t>& waiting, SpscRing& ring, Side side,
                      const WaitOptions& opt) {
  const auto start = Clock::now();
  // Saturating: a "forever" timeout such as nanoseconds::max() must not overflow.
  const auto deadline = opt.timeout >= Clock::time_point::max() - start ? Clock::time_point::max()
                                                                        : start + opt.timeout;
  for (uint32_t i = 0; i < opt.spin; ++i) {
    if (try_once()) return WaitStatus::Ok;
    cpu_relax();
    if (i % 1024 == 1023 && Clock::now() >= deadline) break;  // a huge spin count stays bounded
  }
  for (;;) {
    if (try_once()) return WaitStatus::Ok;  // data left by a peer that died still counts
    if (opt.stop && opt.stop->load(std::memory_order_acquire)) return WaitStatus::Stopped;
    if (opt.peer_alive && !opt.peer_alive()) {
      // The peer may have pushed and died between try_once above and this check: what it left
      // before dying still counts (its index store happened before its death was observable).
      return try_once() ? WaitStatus::Ok : WaitStatus::PeerDead;
    }
    const auto now = Clock::now();
    if (now >= deadline) return WaitStatus::Timeout;
    ring.heartbeat(side);  // a side blocked in a wait is alive, not stalled
    const uint32_t s = seq.load(std::memory_order_acquire);
    waiting.store(1, std::memory_order_relaxed);
    // Pairs with the fence after the peer's index store (see try_push): either we see its new
    // index in try_once, or it sees our flag and bumps `seq` so futex_wait returns at once.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!try_once()) {
      futex_wait(seq, s, std::min<std::chrono::nanoseconds>(deadline - now, opt.poll));
      waiting.store(0, std::memory_order_relaxed);
      continue;
    }
    waiting.store(0, std::memory_order_relaxed);
    return WaitStatus::Ok;
  }
}

void bump_and_wake(std::atomic<uint32_t>& seq, int count) {
  seq.fetch_add(1, std::memory_order_release);
  futex_wake(seq, count);
}

}  // namespace

const char* to_string(WaitStatus s) {
  switch (s) {
    case WaitStatus::Ok:
      return "ok";
    case WaitStatus::Timeout:
      return "timeout";
    case WaitStatus::PeerDead:
      return "peer dead";
    case WaitStatus::Stopped:
      return "stopped";
  }
  return "unknown";
}

void throw_slot_size_mismatch(size_t got, uint32_t slot_size) {
  throw Error(ring_error("item of " + std::to_string(got) + " bytes, slots are " +
                         std::to_string(slot_size) + " bytes"));
}

void throw_ring_corrupt(const char* side, uint64_t head, uint64_t tail) {
  throw Error(ring_error(std::string("corrupt indices seen by the ") + side + ": head " +
                         std::to_string(head) + ", tail " + std::to_string(tail)));
}

size_t SpscRing::required_bytes(uint32_t capacity, uint32_t slot_size) {
  if (!is_pow2(capacity) || capacity > kMaxRingCapacity) {
    throw Error(ring_error("capacity " + std::to_string(capacity) +
                           " is not a power of two in [1, " + std::to_string(kMaxRingCapacity) +
                           "]"));
  }
  if (slot_size == 0 || slot_size > kMaxRingSlotSize) {
    throw Error(ring_error("slot size " + std::to_string(slot_size) + " is not in [1, " +
                           std::to_string(kMaxRingSlotSize) + "]"));
  }
  const auto bytes = ring_bytes(capacity, slot_size);
  if (!bytes || *bytes > std::numeric_limits<size_t>::max()) {
    throw Error(ring_error("ring size overflows"));
  }
  return static_cast<size_t>(*bytes);
}

SpscRing::SpscRing(RingHeader* header, uint32_t capacity, uint32_t slot_size)
    : header_(header),
      slots_(reinterpret_cast<std::byte*>(header) + sizeof(RingHeader)),
      capacity_(capacity),
      slot_size_(slot_size) {}

SpscRing SpscRing::format(void* mem, size_t bytes, uint32_t capacity, uint32_t slot_size) {
  check_placement(mem, bytes);
  const size_t need = required_bytes(capacity, slot_size);
  if (need > bytes) {
    throw Error(ring_error("ring of " + std::to_string(capacity) + " x " +
                           std::to_string(slot_size) + " bytes needs " + std::to_string(need) +
                           " bytes, the memory has " + std::to_string(bytes)));
  }
  // Placement-new starts the atomics' lifetimes; the magic is published last.
  auto* h = new (mem) RingHeader{};
  h->version = kRingVersion;
  h->slot_size = slot_size;
  h->capacity = capacity;
  h->total_bytes = need;
  h->magic.store(kRingMagic, std::memory_order_release);
  return SpscRing(h, capacity, slot_size);
}

SpscRing SpscRing::attach(void* mem, size_t bytes, uint32_t slot_size) {
  check_placement(mem, bytes);
  // The header was written by another process: every field is checked before it is used.
  auto* h = static_cast<RingHeader*>(mem);
  const uint64_t magic = h->magic.load(std::memory_order_acquire);
  if (magic != kRingMagic) throw Error(ring_error("bad magic (not a ring, or not formatted yet)"));
  if (h->version != kRingVersion) {
    throw Error(ring_error("version " + std::to_string(h->version) + ", expected " +
                           std::to_string(kRingVersion)));
  }
  const uint32_t capacity = h->capacity;
  const uint32_t slot = h->slot_size;
  if (!is_pow2(capacity) || capacity > kMaxRingCapacity) {
    throw Error(ring_error("capacity " + std::to_string(capacity) +
                           " is not a power of two in [1, " + std::to_string(kMaxRingCapacity) +
                           "]"));
  }
  if (slot != slot_size) {
    throw Error(ring_error("slot size " + std::to_string(slot) + ", expected " +
                           std::to_string(slot_size)));
  }
  const size_t need = required_bytes(capacity, slot);
  if (h->total_bytes != need) {
    throw Error(ring_error("header says " + std::to_string(h->total_bytes) +
                           " bytes, capacity and slot size give " + std::to_string(need)));
  }
  if (need > bytes) {
    throw Error(ring_error("ring needs " + std::to_string(need) + " bytes, the segment has " +
                           std::to_string(bytes)));
  }
  const uint64_t head = h->head.load(std::memory_order_acquire);
  const uint64_t tail = h->tail.load(std::memory_order_acquire);
  if (tail > head || head - tail > capacity) throw_ring_corrupt("attach", head, tail);
  return SpscRing(h, capacity, slot);
}

size_t SpscRing::size_guess() const {
  const uint64_t tail = header_->tail.load(std::memory_order_acquire);
  const uint64_t head = header_->head.load(std::memory_order_acquire);
  return head > tail ? static_cast<size_t>(std::min<uint64_t>(head - tail, capacity_)) : 0;
}

void SpscRing::heartbeat(Side side) {
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch());
  heartbeat_word(*header_, side)
      .store(static_cast<uint64_t>(ns.count()), std::memory_order_relaxed);
}

std::chrono::steady_clock::time_point SpscRing::last_heartbeat(Side side) const {
  const uint64_t ns = heartbeat_word(*header_, side).load(std::memory_order_relaxed);
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::nanoseconds(static_cast<int64_t>(ns))));
}

void SpscRing::wake_all() {
  bump_and_wake(header_->data_seq, std::numeric_limits<int>::max());
  bump_and_wake(header_->space_seq, std::numeric_limits<int>::max());
}

RingProducer::RingProducer(const SpscRing& ring)
    : ring_(ring),
      head_(ring.header()->head.load(std::memory_order_relaxed)),
      cached_tail_(ring.header()->tail.load(std::memory_order_acquire)) {}

// Clearing the flag first means a burst of pushes costs one syscall, not one each; the sleeper
// re-raises it (after re-reading the sequence) if it has to sleep again.
void RingProducer::wake_consumer() {
  RingHeader& h = *ring_.header();
  if (h.consumer_waiting.exchange(0, std::memory_order_relaxed) != 0) bump_and_wake(h.data_seq, 1);
}

WaitStatus RingProducer::push(const void* src, size_t n, const WaitOptions& opt) {
  RingHeader& h = *ring_.header();
  return wait_until([&] { return try_push(src, n); }, h.space_seq, h.producer_waiting, ring_,
                    Side::Producer, opt);
}

RingConsumer::RingConsumer(const SpscRing& ring)
    : ring_(ring),
      tail_(ring.header()->tail.load(std::memory_order_relaxed)),
      cached_head_(ring.header()->head.load(std::memory_order_acquire)) {}

void RingConsumer::wake_producer() {  // as wake_consumer
  RingHeader& h = *ring_.header();
  if (h.producer_waiting.exchange(0, std::memory_order_relaxed) != 0) bump_and_wake(h.space_seq, 1);
}

WaitStatus RingConsumer::pop(void* dst, size_t n, const WaitOptions& opt) {
  RingHeader& h = *ring_.header();
  return wait_until([&] { return try_pop(dst, n); }, h.data_seq, h.consumer_waiting, ring_,
                    Side::Consumer, opt);
}

}  // namespace moe::shm
