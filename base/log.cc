// Structured log lines in text (logfmt) or JSON.
#include "base/log.h"

#include "base/clock.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace hr::log {
namespace {

std::atomic<Level> g_level{Level::kInfo};
std::atomic<Format> g_format{Format::kText};
std::mutex g_mu;
std::function<void(std::string_view)> g_sink;  // guarded by g_mu

const char* level_name(Level l) {
  switch (l) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
  }
  return "info";
}

std::string timestamp() { return iso8601_utc(SystemClock::instance().now_unix_ms(), true); }

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void append_text_value(std::string& out, std::string_view s) {
  bool needs_quotes = s.empty();
  for (unsigned char c : s) {
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c >= 0x7f) needs_quotes = true;
  }
  if (needs_quotes) {
    append_json_string(out, s);
  } else {
    out += s;
  }
}

std::string number_text(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

Result<Level> parse_level(std::string_view name) {
  if (name == "debug") return Level::kDebug;
  if (name == "info") return Level::kInfo;
  if (name == "warn" || name == "warning") return Level::kWarn;
  if (name == "error") return Level::kError;
  return invalid_argument(
      "unknown log level '" + std::string(name) + "' (expected debug, info, warn or error)",
      "log-level");
}

Result<Format> parse_format(std::string_view name) {
  if (name == "text") return Format::kText;
  if (name == "json") return Format::kJson;
  return invalid_argument("unknown log format '" + std::string(name) + "' (expected text or json)",
                          "log-format");
}

void set_level(Level level) { g_level = level; }
void set_format(Format format) { g_format = format; }
bool enabled(Level level) { return level >= g_level.load(std::memory_order_relaxed); }

void set_sink(std::function<void(std::string_view)> sink) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_sink = std::move(sink);
}

std::string format_line(Format format, Level level, std::string_view event,
                        std::initializer_list<Field> fields) {
  std::string out;
  out.reserve(128);
  if (format == Format::kJson) {
    out += "{\"ts\":";
    append_json_string(out, timestamp());
    out += ",\"level\":";
    append_json_string(out, level_name(level));
    out += ",\"event\":";
    append_json_string(out, event);
    for (const Field& f : fields) {
      out += ',';
      append_json_string(out, f.key);
      out += ':';
      if (auto* s = std::get_if<std::string>(&f.value)) {
        append_json_string(out, *s);
      } else if (auto* i = std::get_if<int64_t>(&f.value)) {
        out += std::to_string(*i);
      } else if (auto* d = std::get_if<double>(&f.value)) {
        out += number_text(*d);
      } else {
        out += std::get<bool>(f.value) ? "true" : "false";
      }
    }
    out += '}';
    return out;
  }
  out += "ts=";
  out += timestamp();
  out += " level=";
  out += level_name(level);
  out += " event=";
  append_text_value(out, event);
  for (const Field& f : fields) {
    out += ' ';
    out += f.key;
    out += '=';
    if (auto* s = std::get_if<std::string>(&f.value)) {
      append_text_value(out, *s);
    } else if (auto* i = std::get_if<int64_t>(&f.value)) {
      out += std::to_string(*i);
    } else if (auto* d = std::get_if<double>(&f.value)) {
      out += number_text(*d);
    } else {
      out += std::get<bool>(f.value) ? "true" : "false";
    }
  }
  return out;
}

void write(Level level, std::string_view event, std::initializer_list<Field> fields) {
  if (!enabled(level)) return;
  std::string line = format_line(g_format.load(std::memory_order_relaxed), level, event, fields);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_sink) {
    g_sink(line);
    return;
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace hr::log
