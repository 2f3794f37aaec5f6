// Progress display for long operations (loading and prefetching model files).
//
// On a terminal a single-line bar is redrawn in place with '\r' (at most every 100 ms); written to
// a file or pipe it prints plain lines instead (every 5 s, or each time another 10% is done) so
// logs stay readable. MOE_PROGRESS=off in the environment turns drawing off; the final summary
// line ("loading model: 17.2 GiB in 12.3 s (1.40 GiB/s)") is printed regardless.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace moe {

class Progress {
 public:
  enum class Unit { Bytes, Count };  // Bytes are shown as KiB/MiB/GiB, Count as plain numbers

  // `what` names the operation (e.g. "loading model"); `total` is in `unit`s (0: unknown, then no
  // percentage or ETA is shown). `out` must stay open until finish().
  Progress(std::string what, uint64_t total, Unit unit, std::FILE* out = stderr);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress();  // finish() if not yet done

  // Adds n units done. Thread-safe and cheap: an atomic add, plus a redraw when one is due.
  void advance(uint64_t n) noexcept;
  // Prints the final line (once; later calls and advances do nothing visible).
  void finish();

  uint64_t done() const { return done_.load(std::memory_order_relaxed); }
  uint64_t total() const { return total_; }
  Unit unit() const { return unit_; }
  bool drawing() const { return enabled_; }  // false with MOE_PROGRESS=off
  bool tty() const { return tty_; }

  // Formatting helpers (public for tests): "512 B", "3.5 KiB", "6.0 MiB", "17.2 GiB".
  static std::string format_bytes(double bytes, int decimals = 1);
  static std::string format_duration(double seconds);  // "8s", "2m05s", "1h02m"

 private:
  using Clock = std::chrono::steady_clock;

  void maybe_draw(uint64_t done);
  void draw_locked(uint64_t done, Clock::time_point now);  // mu_ held
  std::string amount_pair(uint64_t done) const;            // "6.0 / 17.2 GiB" or "600 / 1720"
  std::string rate_text(double per_second, int decimals) const;

  const std::string what_;
  const uint64_t total_;
  const Unit unit_;
  std::FILE* const out_;
  const bool tty_;
  const bool enabled_;
  const Clock::time_point start_;

  std::atomic<uint64_t> done_{0};
  // Earliest time (ns since start_) of the next redraw, and the next 10% step that forces a line
  // (plain output only); read without the lock so that advance() stays cheap.
  std::atomic<int64_t> next_draw_ns_;
  std::atomic<uint64_t> next_step_;  // in tenths of total
  std::atomic<bool> finished_{false};

  std::mutex mu_;         // serializes output
  size_t bar_width_ = 0;  // characters of the last bar drawn (TTY), 0 if none is on screen
};

}  // namespace moe
