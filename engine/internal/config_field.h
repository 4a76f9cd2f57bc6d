// Reading a whole-number field of a config.json (model_config.cc, model_shape.cc): absent or null
// gives `def` (an error naming the key when required); anything but a non-negative integer is an
// error naming the key.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "base/status.h"

namespace hr::engine::internal {

inline Result<int64_t> config_field(const nlohmann::json& j, const char* key, bool required,
                                    int64_t def = 0) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) return invalid_argument(std::string("config.json: missing ") + key, key);
    return def;
  }
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < 0) {
    return invalid_argument(std::string("config.json: ") + key + " must be a non-negative integer",
                            key);
  }
  return j[key].get<int64_t>();
}

}  // namespace hr::engine::internal
