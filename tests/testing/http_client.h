// A blocking HTTP/1.1 client for tests (one connection per call), over loopback.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>

namespace hr::testing {

struct HttpResult {
  int status = 0;  // 0: could not connect
  std::string body;
  std::map<std::string, std::string> headers;
  nlohmann::json json() const { return nlohmann::json::parse(body, nullptr, false); }
};

HttpResult http_call(const std::string& method, int port, const std::string& target,
                     const std::string& body = "",
                     const std::map<std::string, std::string>& headers = {});

}  // namespace hr::testing
