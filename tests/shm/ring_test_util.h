// Helpers shared by the ring tests: aligned scratch memory and checksummed stress items.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace moe::shm::test {

// 64-byte-aligned, zeroed heap memory standing in for a segment in single-process tests.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t n)
      : bytes(n),
        ptr(static_cast<std::byte*>(std::aligned_alloc(64, (n + 63) / 64 * 64)), &std::free) {
    std::memset(ptr.get(), 0, n);
  }
  std::byte* data() const { return ptr.get(); }
  size_t bytes;
  std::unique_ptr<std::byte, void (*)(void*)> ptr;
};

// One 64-byte stress item: a sequence number, a payload derived from it and a checksum, so the
// consumer can detect reordering, loss, duplication and torn copies.
struct Item {
  uint64_t seq;
  uint64_t payload[6];
  uint64_t checksum;
};
static_assert(sizeof(Item) == 64);

inline uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline Item make_item(uint64_t seq) {
  Item it{};
  it.seq = seq;
  uint64_t sum = seq;
  for (int i = 0; i < 6; ++i) {
    it.payload[i] = mix(seq * 6 + static_cast<uint64_t>(i));
    sum = mix(sum ^ it.payload[i]);
  }
  it.checksum = sum;
  return it;
}

inline bool item_ok(const Item& it, uint64_t expected_seq) {
  if (it.seq != expected_seq) return false;
  uint64_t sum = it.seq;
  for (uint64_t p : it.payload) sum = mix(sum ^ p);
  return sum == it.checksum;
}

}  // namespace moe::shm::test
