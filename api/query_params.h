// Query parameters of the API's routes: an integer in a range, or a comma-separated list, with an
// error naming the parameter.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "base/status.h"

namespace hr::api {

// An integer query parameter in [lo, hi]; `def` when absent or empty.
Result<int> int_param(const std::map<std::string, std::string>& query, const std::string& name,
                      int lo, int hi, int def);

// A comma-separated list parameter (`status=failed,expired`): its items, none when absent; an
// empty item is an error.
Result<std::vector<std::string>> list_param(const std::map<std::string, std::string>& query,
                                            const std::string& name);

}  // namespace hr::api
