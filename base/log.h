// Structured logging: one line per event with key=value pairs, or JSON lines with
// `--log-format json`. Thread-safe: each line is written whole under a mutex.
//   hr::log::info("batch.submitted", {{"batch", id}, {"num_requests", n}});
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <variant>

#include "base/status.h"

namespace hr::log {

enum class Level { kDebug = 0, kInfo, kWarn, kError };
enum class Format { kText, kJson };

struct Field {
  using Value = std::variant<std::string, int64_t, double, bool>;
  Field(std::string_view k, std::string_view v) : key(k), value(std::string(v)) {}
  Field(std::string_view k, const char* v) : key(k), value(std::string(v)) {}
  Field(std::string_view k, const std::string& v) : key(k), value(v) {}
  Field(std::string_view k, bool v) : key(k), value(v) {}
  Field(std::string_view k, double v) : key(k), value(v) {}
  template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
  Field(std::string_view k, I v) : key(k), value(static_cast<int64_t>(v)) {}
  Field(std::string_view k, const Status& s) : key(k), value(s.to_string()) {}

  std::string_view key;
  Value value;
};

[[nodiscard]] Result<Level> parse_level(std::string_view name);
[[nodiscard]] Result<Format> parse_format(std::string_view name);
void set_level(Level level);
void set_format(Format format);
bool enabled(Level level);
// Replaces stderr as the destination (tests); an empty function restores stderr.
void set_sink(std::function<void(std::string_view line)> sink);

// Formats one line (without the trailing newline); exposed for tests.
std::string format_line(Format format, Level level, std::string_view event,
                        std::initializer_list<Field> fields);
void write(Level level, std::string_view event, std::initializer_list<Field> fields);

inline void debug(std::string_view event, std::initializer_list<Field> fields = {}) {
  if (enabled(Level::kDebug)) write(Level::kDebug, event, fields);
}
inline void info(std::string_view event, std::initializer_list<Field> fields = {}) {
  write(Level::kInfo, event, fields);
}
inline void warn(std::string_view event, std::initializer_list<Field> fields = {}) {
  write(Level::kWarn, event, fields);
}
inline void error(std::string_view event, std::initializer_list<Field> fields = {}) {
  write(Level::kError, event, fields);
}

}  // namespace hr::log
