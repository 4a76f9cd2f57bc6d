// A multi-threaded HTTP/1.1 server on Boost.Beast: keep-alive, a body limit, read/write timeouts
// and graceful shutdown (stop accepting, finish in-flight requests). I/O runs on `io_threads`;
// each request's handler runs on a separate pool of `handler_threads`, so blocking database work
// never stalls the event loop. Thread-safe: start/stop may be called from any thread.
#pragma once

#include <boost/beast/http.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace hr::http {

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;
using HttpResponse = boost::beast::http::response<boost::beast::http::string_body>;
using Handler = std::function<HttpResponse(const HttpRequest&)>;
// A body produced piece by piece (server-sent events): called repeatedly on a handler thread, it
// blocks until the next piece, appends it to `chunk` and returns true, or returns false at the end.
using BodyStream = std::function<bool(std::string* chunk)>;
// A handler's answer: a whole response, or (when `stream` is set) the response's status and
// headers followed by a chunked body from `stream`. With `stream_bytes` the stream yields exactly
// that many bytes and goes out with a Content-Length instead; one that ends short closes the
// connection, so the client sees the body cut off rather than complete.
struct Reply {
  HttpResponse response;
  BodyStream stream;
  std::optional<uint64_t> stream_bytes = std::nullopt;
};
using StreamingHandler = std::function<Reply(const HttpRequest&)>;

// On a handler thread, while its handler runs: whether the client of that request has closed its
// connection (a peek at the socket; nothing is read). False on any other thread. Lets a handler
// that waits (for capacity, say) give up on a client that has gone.
bool current_client_gone();
// On a handler thread, while its handler or the header check runs: the client's IP address as
// text ("127.0.0.1", "::1"; an IPv4-mapped IPv6 address as its IPv4), or "" on any other thread.
std::string current_client_address();

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;  // 0: any free port
  int io_threads = 2;
  int handler_threads = 8;
  size_t body_limit_bytes = 10 << 20;
  // Uploads: a request for which is_upload(method, target) holds may carry a body of up to
  // upload_limit_bytes and has upload_read_timeout_s to arrive. The limit is chosen from the
  // request's header, before its body is read.
  std::function<bool(boost::beast::http::verb, std::string_view target)> is_upload;
  size_t upload_limit_bytes = 0;
  int upload_read_timeout_s = 600;
  // The JSON body of the server's own answers (413 for a body over its limit, 503 while stopping
  // or full, 500 for a handler that threw), by the request's target (default:
  // {"error": {"code", "message", "field"?}}). Their HTTP status is http_status_for() the Status's
  // code.
  std::function<std::string(std::string_view target, const Status&)> error_body_for;
  // Run on a handler thread after the header of a request that carries a body, before that body
  // is read: an answer here (a 401 for a missing or unknown key, say) goes out at once and the
  // connection closes unread, so that nobody without a key can make the server read a large body.
  // The request passed has its header only. Unset, or nullopt: the body is read.
  std::function<std::optional<HttpResponse>(const HttpRequest& header)> check_header;
  int read_timeout_s = 30;
  int write_timeout_s = 30;
  int drain_timeout_s = 30;
  // Connections open at once; a connection beyond them is answered 503 and closed unread.
  int max_connections = 4096;
  // After a failed accept (out of file descriptors, say), the acceptor waits this long before
  // trying again rather than spinning on the connection it cannot take.
  int accept_retry_ms = 50;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, Handler handler);
  HttpServer(HttpServerOptions options, StreamingHandler handler);
  ~HttpServer();

  // Binds and starts serving. kUnavailable when the address cannot be bound.
  [[nodiscard]] Status start();
  uint16_t port() const { return bound_port_; }
  // Stops accepting, waits (up to drain_timeout_s) for in-flight requests to be answered, then
  // stops. A request read in full after stop() began gets 503 without reaching the handler, so
  // nothing is done for a client that is never told.
  void stop();

  struct Impl;  // implementation detail, public only so sessions can reach it

 private:
  std::unique_ptr<Impl> impl_;
  std::atomic<uint16_t> bound_port_{0};
};

// A JSON response with the right content type.
HttpResponse json_response(unsigned status, const std::string& body, unsigned version = 11,
                           bool keep_alive = true);

}  // namespace hr::http
