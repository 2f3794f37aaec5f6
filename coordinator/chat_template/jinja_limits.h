// Resource limits for rendering untrusted templates: a hostile template must fail with an error
// instead of hanging or exhausting memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "coordinator/chat_template/jinja_error.h"

namespace moe::jinja {

struct Limits {
  size_t max_source_bytes = 4u << 20;    // template text
  size_t max_nesting = 100;              // parser nesting of blocks and expressions
  size_t max_call_depth = 64;            // macro / caller recursion
  size_t max_output_bytes = 64u << 20;   // any single string, including the rendered output
  size_t max_list_items = 1u << 20;      // range(), list repetition, concatenation
  uint64_t max_steps = 10'000'000;       // evaluated nodes and loop iterations
  uint64_t max_work_bytes = 2ull << 30;  // total bytes produced by string operations
};

// Per-render counters against the limits.
class Budget {
 public:
  explicit Budget(const Limits& limits) : limits_(limits) {}
  const Limits& limits() const { return limits_; }

  void step() {
    if (++steps_ > limits_.max_steps) fail("template exceeded the step limit (runaway loop?)");
  }
  // Called before building a string of `bytes` bytes.
  void string_bytes(size_t bytes) {
    if (bytes > limits_.max_output_bytes) fail("template produced a string larger than the limit");
    work_ += bytes;
    if (work_ > limits_.max_work_bytes) fail("template exceeded the work limit");
  }
  void check_size(size_t bytes) const {
    if (bytes > limits_.max_output_bytes) fail("template produced a string larger than the limit");
  }
  // Called before building a list of n items; the copies count as work like string bytes.
  void list_items(size_t n) {
    if (n > limits_.max_list_items) fail("template produced a list longer than the limit");
    step();
    work_ += n * 32;
    if (work_ > limits_.max_work_bytes) fail("template exceeded the work limit");
  }

 private:
  Limits limits_;
  uint64_t steps_ = 0;
  uint64_t work_ = 0;
};

// The budget of the render running on this thread. Deep operations on values (printing, JSON,
// equality) charge it per element: shared sub-lists make nested structures exponentially large.
class ActiveBudget {
 public:
  explicit ActiveBudget(Budget& b) : prev_(current_) { current_ = &b; }
  ~ActiveBudget() { current_ = prev_; }
  ActiveBudget(const ActiveBudget&) = delete;
  ActiveBudget& operator=(const ActiveBudget&) = delete;
  static Budget* get() { return current_; }

 private:
  Budget* prev_;
  static inline thread_local Budget* current_ = nullptr;
};

// Bounds recursion over nested values (printing, JSON, equality): a template can nest a list in
// itself a million times, and the C++ stack must not overflow on it.
class ValueDepthGuard {
 public:
  static constexpr int kMaxDepth = 200;
  ValueDepthGuard() {
    if (++depth_ > kMaxDepth) {
      --depth_;
      fail("value nested too deeply");
    }
  }
  ~ValueDepthGuard() { --depth_; }
  ValueDepthGuard(const ValueDepthGuard&) = delete;
  ValueDepthGuard& operator=(const ValueDepthGuard&) = delete;

 private:
  static inline thread_local int depth_ = 0;
};

inline void charge_step() {
  if (Budget* b = ActiveBudget::get()) b->step();
}
inline void charge_string(size_t bytes) {
  if (Budget* b = ActiveBudget::get()) b->string_bytes(bytes);
}
// Only checks a growing string against the size cap (its bytes are charged once when complete).
inline void check_size(size_t bytes) {
  if (Budget* b = ActiveBudget::get()) b->check_size(bytes);
}

}  // namespace moe::jinja
