// The HTTP server (http/server.h) on any bytes a client may send: one server in the process, on
// loopback, with a key check before bodies, an upload route with its own limit and a streamed
// answer; each input is sent on a fresh connection whose sending side is then closed, and the
// answer read to its end. Whatever arrives must be HTTP/1.x answers.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "http/server.h"

namespace {

namespace beast_http = boost::beast::http;

hr::http::HttpServer& server() {
  static hr::http::HttpServer* s = [] {
    hr::http::HttpServerOptions o;
    o.port = 0;
    o.io_threads = 1;
    o.handler_threads = 2;
    o.body_limit_bytes = 64 << 10;
    o.is_upload = [](beast_http::verb m, std::string_view target) {
      return m == beast_http::verb::post && target == "/upload";
    };
    o.upload_limit_bytes = 1 << 20;
    o.read_timeout_s = 2;
    o.write_timeout_s = 2;
    o.check_header = [](const hr::http::HttpRequest& h) -> std::optional<hr::http::HttpResponse> {
      auto it = h.find(beast_http::field::authorization);
      if (it != h.end() && it->value() == "Bearer bad") {
        return hr::http::json_response(401, R"({"error":"bad key"})", h.version(), false);
      }
      return std::nullopt;
    };
    auto handler = [](const hr::http::HttpRequest& req) {
      hr::http::Reply r;
      r.response = hr::http::json_response(200, std::to_string(req.body().size()), req.version(),
                                           req.keep_alive());
      if (req.target() == "/stream") {
        auto n = std::make_shared<int>(0);
        r.stream = [n](std::string* out) {
          if (++*n > 3) return false;
          *out = "piece" + std::to_string(*n);
          return true;
        };
      }
      return r;
    };
    auto* srv = new hr::http::HttpServer(o, hr::http::StreamingHandler(handler));
    if (!srv->start().is_ok()) std::abort();
    return srv;
  }();
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint16_t port = server().port();
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Hundreds of thousands of connections a run: close each with a reset, so that none waits in
  // TIME_WAIT holding a local port, and wait a moment if the ports ran out all the same.
  const linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  for (int tries = 0; ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0;) {
    if (++tries == 100) std::abort();
    ::close(fd);
    ::usleep(10000);
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  for (size_t sent = 0; sent < size;) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server answered early and closed
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
    answer.append(buf, static_cast<size_t>(n));
    if (answer.size() > (4 << 20)) std::abort();  // far more than any answer here
  }
  ::close(fd);
  if (!answer.empty() && answer.rfind("HTTP/1.", 0) != 0) std::abort();
  return 0;
}
