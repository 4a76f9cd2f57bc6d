// A blocking HTTP/1.1 client for tests (one connection per call), over loopback.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
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

// A raw TCP connection to 127.0.0.1:port, for requests a well-behaved client would not send (a
// header whose body never comes, say). Throws when it cannot connect. With `timeout_ms`, a read
// that waits longer than that gives up (receive() returns what it has).
class RawConnection {
 public:
  explicit RawConnection(int port, int timeout_ms = 0);
  ~RawConnection();
  void send(const std::string& bytes);
  // What arrives until the server closes the connection or `until` appears.
  std::string receive(const std::string& until = "");

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hr::testing
