// The system clock.
#include "base/clock.h"

#include <cstdio>
#include <ctime>

namespace hr {

int64_t SystemClock::now_unix_ms() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string iso8601_utc(int64_t unix_ms, bool with_ms) {
  int64_t secs_part = unix_ms >= 0 ? unix_ms / 1000 : (unix_ms - 999) / 1000;
  std::time_t secs = static_cast<std::time_t>(secs_part);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  int n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900,
                        tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
  if (with_ms) {
    std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(unix_ms - secs_part * 1000));
  } else {
    std::snprintf(buf + n, sizeof buf - n, "Z");
  }
  return buf;
}

SystemClock& SystemClock::instance() {
  static SystemClock clock;
  return clock;
}

}  // namespace hr
