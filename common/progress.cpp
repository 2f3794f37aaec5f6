#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace moe {
namespace {

constexpr int64_t kTtyIntervalNs = 100'000'000;      // redraw the bar at most every 100 ms
constexpr int64_t kPlainIntervalNs = 5'000'000'000;  // a plain line at least every 5 s
constexpr size_t kBarCells = 30;
constexpr double kMinRateSeconds = 0.5;  // the bar shows no rate or ETA before this

bool env_disables_drawing() {
  const char* v = std::getenv("MOE_PROGRESS");
  if (!v) return false;
  return std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 ||
         std::strcmp(v, "no") == 0;
}

// Tenths (steps = 10) or percent (steps = 100) of total done, clamped to `steps`. Avoids
// overflowing done * steps for any total below 2^64 / 100.
uint64_t fraction_of(uint64_t done, uint64_t total, uint64_t steps) {
  if (total == 0) return 0;
  if (done >= total) return steps;
  return done / total * steps + (done % total) * steps / total;
}

struct ByteScale {
  double divisor;
  const char* name;
};

ByteScale scale_for(double bytes) {
  static constexpr ByteScale kScales[] = {{1.0, "B"},
                                          {1024.0, "KiB"},
                                          {1048576.0, "MiB"},
                                          {1073741824.0, "GiB"},
                                          {1099511627776.0, "TiB"}};
  size_t i = 0;
  while (i + 1 < std::size(kScales) && bytes >= kScales[i + 1].divisor) ++i;
  return kScales[i];
}

}  // namespace

Progress::Progress(std::string what, uint64_t total, Unit unit, std::FILE* out)
    : what_(std::move(what)),
      total_(total),
      unit_(unit),
      out_(out),
      tty_(out != nullptr && isatty(fileno(out)) == 1),
      enabled_(out != nullptr && !env_disables_drawing()),
      start_(Clock::now()),
      next_draw_ns_(tty_ ? 0 : kPlainIntervalNs),
      next_step_(1) {}

Progress::~Progress() {
  try {
    finish();
  } catch (...) {  // formatting may allocate; a destructor must not throw
  }
}

void Progress::advance(uint64_t n) noexcept {
  const uint64_t now_done = done_.fetch_add(n, std::memory_order_relaxed) + n;
  if (!enabled_ || finished_.load(std::memory_order_relaxed)) return;
  try {
    maybe_draw(now_done);
  } catch (...) {  // drawing is best effort (out of memory): the count above is what matters
  }
}

void Progress::maybe_draw(uint64_t now_done) {
  auto due = [&](uint64_t d, int64_t now_ns) {
    if (now_ns >= next_draw_ns_.load(std::memory_order_relaxed)) return true;
    return !tty_ && total_ > 0 &&
           fraction_of(d, total_, 10) >= next_step_.load(std::memory_order_relaxed);
  };
  auto since_start = [&](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - start_).count();
  };
  if (!due(now_done, since_start(Clock::now()))) return;

  std::lock_guard lock(mu_);
  if (finished_.load()) return;
  // Another thread may have drawn meanwhile: decide again with the latest count.
  const uint64_t d = done_.load(std::memory_order_relaxed);
  const Clock::time_point now = Clock::now();
  if (!due(d, since_start(now))) return;
  draw_locked(d, now);
}

void Progress::draw_locked(uint64_t d, Clock::time_point now) {
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(d) / elapsed : 0.0;
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - start_).count();

  if (tty_) {
    next_draw_ns_.store(now_ns + kTtyIntervalNs, std::memory_order_relaxed);
    std::string line = what_;
    if (total_ > 0) {
      const uint64_t pct = fraction_of(d, total_, 100);
      const size_t filled = static_cast<size_t>(fraction_of(d, total_, kBarCells));
      line += " [" + std::string(filled, '#') + std::string(kBarCells - filled, '-') + "] ";
      char buf[8];
      std::snprintf(buf, sizeof buf, "%3u%%", static_cast<unsigned>(pct));
      line += buf;
    }
    line += "  " + amount_pair(d);
    // Rate and ETA only once they mean something (the first draw comes right at the start).
    if (elapsed >= kMinRateSeconds) {
      line += "  " + rate_text(rate, 2);
      if (total_ > 0 && d < total_ && rate > 0) {
        line += "  ETA " + format_duration(static_cast<double>(total_ - d) / rate);
      }
    }
    const size_t width = line.size();
    if (width < bar_width_) line.append(bar_width_ - width, ' ');  // erase the previous bar's tail
    std::fprintf(out_, "\r%s", line.c_str());
    bar_width_ = width;
  } else {
    next_draw_ns_.store(now_ns + kPlainIntervalNs, std::memory_order_relaxed);
    if (total_ > 0) {
      next_step_.store(fraction_of(d, total_, 10) + 1, std::memory_order_relaxed);
      if (d >= total_) return;  // finish() prints the complete line
      std::fprintf(out_, "%s: %u%% (%s, %s)\n", what_.c_str(),
                   static_cast<unsigned>(fraction_of(d, total_, 100)), amount_pair(d).c_str(),
                   rate_text(rate, 1).c_str());
    } else {
      std::fprintf(out_, "%s: %s (%s)\n", what_.c_str(), amount_pair(d).c_str(),
                   rate_text(rate, 1).c_str());
    }
  }
  std::fflush(out_);
}

void Progress::finish() {
  if (finished_.exchange(true)) return;
  if (out_ == nullptr) return;
  std::lock_guard lock(mu_);
  const uint64_t d = done_.load();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  if (tty_ && bar_width_ > 0) {
    std::fprintf(out_, "\r%s\r", std::string(bar_width_, ' ').c_str());
    bar_width_ = 0;
  }
  const std::string amount =
      (total_ > 0 && d != total_)
          ? amount_pair(d)
          : (unit_ == Unit::Bytes ? format_bytes(static_cast<double>(d)) : std::to_string(d));
  const double rate = elapsed > 0 ? static_cast<double>(d) / elapsed : 0.0;
  std::fprintf(out_, "%s: %s in %.1f s (%s)\n", what_.c_str(), amount.c_str(), elapsed,
               rate_text(rate, 2).c_str());
  std::fflush(out_);
}

std::string Progress::amount_pair(uint64_t d) const {
  if (unit_ == Unit::Count) {
    return total_ > 0 ? std::to_string(d) + " / " + std::to_string(total_) : std::to_string(d);
  }
  if (total_ == 0) return format_bytes(static_cast<double>(d));
  // Both numbers in the unit of the larger one: "6.0 / 17.2 GiB".
  const ByteScale s = scale_for(static_cast<double>(std::max(d, total_)));
  const int decimals = s.divisor == 1.0 ? 0 : 1;
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.*f / %.*f %s", decimals, static_cast<double>(d) / s.divisor,
                decimals, static_cast<double>(total_) / s.divisor, s.name);
  return buf;
}

std::string Progress::rate_text(double per_second, int decimals) const {
  if (unit_ == Unit::Bytes) return format_bytes(per_second, decimals) + "/s";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f/s", decimals, per_second);
  return buf;
}

std::string Progress::format_bytes(double bytes, int decimals) {
  const ByteScale s = scale_for(bytes);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %s", s.divisor == 1.0 ? 0 : decimals, bytes / s.divisor,
                s.name);
  return buf;
}

std::string Progress::format_duration(double seconds) {
  // Clamped: a rate near zero gives absurd (or infinite) estimates.
  const double clamped = seconds > 0 ? std::min(seconds, 99.0 * 3600.0) : 0.0;  // also NaN
  const auto s = static_cast<uint64_t>(clamped + 0.5);
  char buf[48];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%us", static_cast<unsigned>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%um%02us", static_cast<unsigned>(s / 60),
                  static_cast<unsigned>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lluh%02um", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned>(s / 60 % 60));
  }
  return buf;
}

}  // namespace moe
