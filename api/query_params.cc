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

Result<std::vector<std::string>> list_param(const std::map<std::string, std::string>& query,
                                            const std::string& name) {
  std::vector<std::string> out;
  auto it = query.find(name);
  if (it == query.end()) return out;
  const std::string& v = it->second;
  for (size_t start = 0;;) {
    size_t comma = v.find(',', start);
    std::string item =
        v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) return invalid_argument(name + " must be a comma-separated list", name);
    out.push_back(std::move(item));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

}  // namespace hr::api
