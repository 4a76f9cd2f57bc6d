// Query parameters.
#include "api/query_params.h"

namespace hr::api {

Result<int> int_param(const std::map<std::string, std::string>& query, const std::string& name,
                      int lo, int hi, int def) {
  auto it = query.find(name);
  if (it == query.end() || it->second.empty()) return def;
  int v = 0;
  try {
    size_t used = 0;
    v = std::stoi(it->second, &used);
    if (used != it->second.size()) v = lo - 1;
  } catch (...) {
    v = lo - 1;
  }
  if (v < lo || v > hi) {
    return invalid_argument(
        name + " must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi),
        name);
  }
  return v;
}

}  // namespace hr::api
