// Overflow-checked integer arithmetic for sizes computed from untrusted input (GGUF headers).
#pragma once

#include <cstdint>
#include <optional>

namespace moe {

// Each returns nullopt when the exact result does not fit the type.
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Rounds x up to a multiple of `align` (a power of two); nullopt on overflow.
inline std::optional<uint64_t> checked_align_up(uint64_t x, uint64_t align) {
  auto bumped = checked_add(x, align - 1);
  if (!bumped) return std::nullopt;
  return *bumped & ~(align - 1);
}

}  // namespace moe
