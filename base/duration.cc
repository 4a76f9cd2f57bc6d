// Durations as configuration and requests write them.
#include "base/duration.h"

#include <cctype>

namespace hr {

Result<int64_t> parse_duration_ms(const std::string& text, const std::string& field) {
  if (text.size() < 2) return invalid_argument("duration must look like 24h, 90m or 30s", field);
  char unit = text.back();
  int64_t mult = unit == 's'   ? 1000
                 : unit == 'm' ? 60000
                 : unit == 'h' ? 3600000
                 : unit == 'd' ? 86400000
                               : 0;
  int64_t n = 0;
  for (size_t i = 0; i + 1 < text.size() && mult != 0; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i])) || n > 1000000) {
      mult = 0;  // stop before n can overflow
    } else {
      n = n * 10 + (text[i] - '0');
    }
  }
  if (mult == 0 || n <= 0)
    return invalid_argument("duration must look like 24h, 90m or 30s", field);
  int64_t ms = n * mult;
  if (ms > 7LL * 86400000) return invalid_argument("duration must be at most 7d", field);
  return ms;
}

}  // namespace hr
