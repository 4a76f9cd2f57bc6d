// Durations as configuration and requests write them ("24h", "90m", "30s", "2d").
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace hr {

// "24h", "90m", "30s", "2d" → milliseconds, at most 7 days; errors name `field`.
[[nodiscard]] Result<int64_t> parse_duration_ms(const std::string& text, const std::string& field);

}  // namespace hr
