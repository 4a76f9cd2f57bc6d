// Clocks: wall time for timestamps and deadlines, steady time for intervals. Components that make
// time-based decisions (leases, deadlines, retries) take a Clock& so tests can drive time.
// SystemClock is stateless; ManualClock is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace hr {

class Clock {
 public:
  virtual ~Clock() = default;
  // Unix time in milliseconds.
  virtual int64_t now_unix_ms() const = 0;
};

class SystemClock final : public Clock {
 public:
  int64_t now_unix_ms() const override;
  static SystemClock& instance();
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_unix_ms) : now_(start_unix_ms) {}
  int64_t now_unix_ms() const override { return now_.load(); }
  void advance_ms(int64_t ms) { now_ += ms; }

 private:
  std::atomic<int64_t> now_;
};

// Unix milliseconds as UTC in ISO 8601: 2026-11-27T21:04:05Z (with_ms: 2026-11-27T21:04:05.123Z).
std::string iso8601_utc(int64_t unix_ms, bool with_ms = false);

// Monotonic nanoseconds, for measuring intervals.
inline int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace hr
