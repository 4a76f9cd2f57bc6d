// Query parameters of the API's routes: an integer in a range, with an error naming the parameter.
#pragma once

#include <map>
#include <string>

#include "base/status.h"

namespace hr::api {

// An integer query parameter in [lo, hi]; `def` when absent or empty.
Result<int> int_param(const std::map<std::string, std::string>& query, const std::string& name,
                      int lo, int hi, int def);

}  // namespace hr::api
