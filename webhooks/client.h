// One webhook POST over HTTP or HTTPS with a hard deadline. The host is resolved and every address
// checked against the AddressPolicy (SSRF guard) before anything is sent, and the connection goes
// to exactly those addresses. HTTPS verifies the certificate chain and the host name, and sends
// SNI. Redirects are not followed (a 3xx is just a status). Only the response status and
// Retry-After are read. Not thread-safe: one client per sending thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "webhooks/address_policy.h"

namespace hr::webhooks {

struct ClientOptions {
  int timeout_ms = 15000;  // the whole attempt: resolve, connect, TLS, send, answer
  std::string ca_file;     // extra trusted CAs (PEM), besides the system's
  AddressPolicy policy;
  std::string user_agent;  // default: Headroom-Webhooks/<version>
};

struct PostResult {
  int status = 0;  // HTTP status; 0 when no answer came
  // What went wrong when status is 0 (or refused), as the tenant sees it: every failure before
  // an HTTP answer reads alike (a closed port, a service that is not HTTP and a reset connection
  // must not be told apart from the delivery log: that would make webhooks a port scanner), a
  // timeout and a TLS failure aside. `detail` is the cause, for the operator's log only.
  std::string error;
  std::string detail;
  bool refused = false;  // the address policy refused the target; nothing was sent
  std::optional<int64_t> retry_after_ms;
  int duration_ms = 0;
};

class Client {
 public:
  explicit Client(ClientOptions options);
  ~Client();

  PostResult post(const std::string& url, const std::map<std::string, std::string>& headers,
                  const std::string& body);

 private:
  ClientOptions options_;
  boost::asio::io_context ioc_;
  std::unique_ptr<boost::asio::ssl::context> tls_;
  Status tls_status_;
};

// Retry-After as seconds or an HTTP date, relative to `now_ms`; nullopt when unparseable.
std::optional<int64_t> parse_retry_after(const std::string& value, int64_t now_ms);

}  // namespace hr::webhooks
