// libFuzzer harness: any byte string must either parse or throw moe::Error. On success every
// accessor is exercised and every tensor's first and last byte is read, so AddressSanitizer checks
// the bounds the parser vouched for.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "common/error.h"
#include "common/gguf.h"

namespace {

// A double's bits. A value cast to an integer would be undefined behaviour for NaN, infinities,
// negatives and anything out of range, all of which a file may hold.
uint64_t bits(double d) { return std::bit_cast<uint64_t>(d); }

void exercise(const moe::gguf::GgufFile& f) {
  using moe::gguf::ArrayValue;
  volatile uint64_t sink = 0;
  for (const auto& kv : f.metadata()) {
    if (f.find(kv.key) == nullptr) __builtin_trap();  // every key must be found again
    try {
      sink = sink + f.require_uint(kv.key);
    } catch (const moe::Error&) {
    }
    try {
      sink = sink + bits(f.require_float(kv.key));
    } catch (const moe::Error&) {
    }
    try {
      sink = sink + f.require_string(kv.key).size();
    } catch (const moe::Error&) {
    }
    const auto* a = std::get_if<ArrayValue>(&kv.value.v);
    if (!a) continue;
    // First elements, the last one, and one past the end (must throw, not read). For an empty
    // array count - 1 wraps to the largest index (unsigned, well defined), which must throw too.
    for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{2}, a->count - 1, a->count}) {
      const bool in_range = i < a->count;
      try {
        sink = sink + static_cast<uint64_t>(a->int_at(i));
        if (!in_range) __builtin_trap();
      } catch (const moe::Error&) {
      }
      try {
        sink = sink + bits(a->float_at(i));
        if (!in_range) __builtin_trap();
      } catch (const moe::Error&) {
      }
      try {
        sink = sink + a->string_at(i).size();
        if (!in_range) __builtin_trap();
      } catch (const moe::Error&) {
      }
    }
  }
  for (const auto& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t) __builtin_trap();  // names are unique
    if (t.n_bytes == 0 || t.n_elements() <= 0) __builtin_trap();
    sink = sink + t.data[0] + t.data[t.n_bytes - 1];
  }
  (void)f.find_tensor("token_embd.weight");
  (void)f.get_uint("general.alignment", 0);
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = moe::gguf::GgufFile::parse(std::span<const uint8_t>(data, size), "fuzz");
    exercise(f);
  } catch (const moe::Error&) {
  }
  return 0;
}
