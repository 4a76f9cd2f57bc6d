// URL parsing for service locations (postgresql://, redis://) and webhook targets.
// Only what those need: scheme://[user[:password]@]host[:port][/path][?query]. IPv6 hosts in [].
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace hr {

struct Url {
  std::string scheme;    // lowercase
  std::string user;      // percent-decoded
  std::string password;  // percent-decoded
  std::string host;      // without brackets for IPv6
  uint16_t port = 0;     // 0 when absent
  std::string path;      // starts with '/' when present
  std::string query;     // without '?'

  // The URL with the password replaced by "***", for logs.
  std::string redacted() const;
};

[[nodiscard]] Result<Url> parse_url(std::string_view text);
std::string percent_decode(std::string_view s);

}  // namespace hr
