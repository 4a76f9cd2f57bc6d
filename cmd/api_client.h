// A small synchronous HTTP/1.1 client of Headroom's own API, for `headroom batch`: one request at a
// time on a fresh connection, a deadline per call, the answer read whole. Plain http:// only (put
// TLS in front of the API at a proxy; this client refuses https:// with a clear error).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "base/status.h"

namespace hr::cmd {

struct ApiReply {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
};

class ApiClient {
 public:
  // `base_url`: http://host[:port][/prefix]. Errors name HEADROOM_URL.
  [[nodiscard]] static Result<ApiClient> create(const std::string& base_url, std::string api_key,
                                                int timeout_ms = 60000);

  // `target` is appended to the base URL's path. kUnavailable when no answer came.
  [[nodiscard]] Result<ApiReply> call(const std::string& method, const std::string& target,
                                      const std::string& body = "",
                                      const std::string& content_type = "application/json") const;

  const std::string& base_url() const { return base_url_; }

 private:
  std::string base_url_, host_, port_, prefix_, api_key_;
  int timeout_ms_ = 60000;
};

// The message of an API error answer (either shape), or the status line when there is none.
std::string api_error_message(const ApiReply& reply);

}  // namespace hr::cmd
