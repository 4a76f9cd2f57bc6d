// One HTTP exchange between the API's router and a worker, over a connection of its own that the
// pool (api/worker_connections.h) keeps open between calls. Private to api/: used by the pool and
// the router.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "api/worker_connections.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/status.h"
#include "base/url.h"

namespace hr::api {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace beast_http = beast::http;
using tcp = asio::ip::tcp;

// An open connection to one worker, with an io_context of its own, so that whichever handler
// thread holds it can drive it.
struct WorkerConnection {
  explicit WorkerConnection(std::string u) : url(std::move(u)) {}
  std::string url;
  asio::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
  int64_t idle_since_ns = 0;
};

inline metrics::Counter& connects(const std::string& connection) {
  return metrics::counter("headroom_sync_worker_connections_total",
                          "Connections to workers used for sync calls: opened for the call, or "
                          "kept open from an earlier one",
                          "connection=\"" + connection + "\"");
}

inline metrics::Gauge& idle_connections() {
  return metrics::gauge("headroom_sync_worker_connections_idle",
                        "Connections to workers kept open for the next sync call");
}

// Whether an idle connection can carry another request: the worker has not closed it (nor sent
// anything unasked). A peek; nothing is read.
inline bool still_open(WorkerConnection& c) {
  if (!c.stream.socket().is_open()) return false;
  char byte;
  ssize_t n = ::recv(c.stream.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

// One HTTP exchange with a worker over a connection of its own (kept open from an earlier call
// when the pool has one): send, read the header, then the body in pieces as they arrive. The
// connection goes back to the pool when the answer has been read to its end and both sides keep
// it open.
class WorkerCall {
 public:
  // `client_gone` (may be empty) is polled while the call waits on the worker: when it says the
  // client left, the connection is closed, so that the worker stops generating, and the call ends
  // with kCancelled.
  WorkerCall(const RouterOptions& o, WorkerConnections* pool, std::function<bool()> client_gone)
      : options_(o), pool_(pool), client_gone_(std::move(client_gone)) {}
  ~WorkerCall() {
    if (conn_ && !broken_ && parser_ && parser_->is_done() && parser_->get().keep_alive() &&
        !parser_->need_eof() && conn_->buffer.size() == 0) {
      pool_->give_back(std::move(conn_));
    }
  }
  WorkerCall(const WorkerCall&) = delete;
  WorkerCall& operator=(const WorkerCall&) = delete;

  // kUnavailable when the worker cannot be reached or drops the connection before answering.
  Status open(const std::string& url, const std::string& body) {
    Result<Url> u = parse_url(url);
    if (!u.is_ok() || u->scheme != "http" || u->host.empty() || u->port == 0) {
      return unavailable("worker URL is not http://host:port: " + url);
    }
    beast_http::request<beast_http::string_body> req{beast_http::verb::post, "/internal/sync", 11};
    req.set(beast_http::field::host, u->host + ":" + std::to_string(u->port));
    req.set(beast_http::field::content_type, "application/json");
    if (!options_.internal_token.empty())
      req.set("x-headroom-internal-token", options_.internal_token);
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    conn_ = pool_->take(url);
    if (conn_) {
      connects("reused").add();
      Status st = exchange(req, url);
      // A worker may close an idle connection just as the request goes out (its own limit on
      // waiting): then the request did not reach it, and a new connection is tried once. Any
      // other failure (a timeout, a reset once the worker had time to start) is the worker's.
      if (!stale_) return st;
      log::debug("router.stale_connection", {{"url", url}, {"error", st}});
    }
    conn_ = std::make_unique<WorkerConnection>(url);
    broken_ = false;
    beast::error_code ec;
    tcp::resolver resolver(conn_->ioc);
    auto eps = resolver.resolve(u->host, std::to_string(u->port), ec);
    if (ec) return unavailable("resolve " + u->host + ": " + ec.message());
    conn_->stream.expires_after(std::chrono::milliseconds(options_.connect_timeout_ms));
    conn_->stream.async_connect(eps, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
    if (!run()) return client_left();
    if (ec) return unavailable("connect " + url + ": " + ec.message());
    connects("new").add();
    // A request that stays unacknowledged this long fails the connection: a worker host that
    // vanished (no FIN, no RST) is given up on in seconds, not after the idle timeout. It does not
    // limit how long an answer may take: nothing of ours is unacknowledged meanwhile.
    const unsigned int unacked_ms =
        static_cast<unsigned int>(std::max(5000, options_.connect_timeout_ms));
    ::setsockopt(conn_->stream.socket().native_handle(), IPPROTO_TCP, TCP_USER_TIMEOUT, &unacked_ms,
                 sizeof unacked_ms);
    return exchange(req, url);
  }

  int status() const { return static_cast<int>(parser_->get().result_int()); }

  // Appends the next piece of the body to `out`; false once the body is complete.
  Result<bool> read_some(std::string* out, int timeout_ms = 0) {
    if (parser_->is_done()) return false;
    char tmp[8192];
    parser_->get().body().data = tmp;
    parser_->get().body().size = sizeof tmp;
    beast::error_code ec;
    conn_->stream.expires_after(
        std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : options_.idle_timeout_ms));
    beast_http::async_read_some(conn_->stream, conn_->buffer, *parser_,
                                [&](beast::error_code e, size_t) { ec = e; });
    if (!run()) return client_left();
    if (ec == beast_http::error::need_buffer) ec = {};
    if (ec) {
      broken_ = true;
      return unavailable("the worker's answer broke off: " + ec.message());
    }
    out->append(tmp, sizeof tmp - parser_->get().body().size);
    return true;
  }

  Result<std::string> read_all() {
    std::string body;
    for (;;) {
      HR_ASSIGN_OR_RETURN(bool more, read_some(&body));
      if (!more) return body;
    }
  }

  // After the last line of a streamed answer: reads the end of the body (the last chunk follows
  // at once), so that the connection can carry the next call. Anything more, or nothing within a
  // second, and the connection is closed instead.
  void finish_reading() {
    std::string rest;
    for (int i = 0; i < 4 && !parser_->is_done(); ++i) {
      Result<bool> more = read_some(&rest, 1000);
      if (!more.is_ok() || !rest.empty()) {
        broken_ = true;
        return;
      }
    }
  }

 private:
  // Sends `req` and reads the answer's header.
  // Sets stale_ when it failed as on a connection the worker had already closed: the request
  // could not be sent, or the connection ended at once, before any of the answer.
  Status exchange(const beast_http::request<beast_http::string_body>& req, const std::string& url) {
    parser_.emplace();
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    stale_ = false;
    beast::error_code ec;
    conn_->stream.expires_after(std::chrono::milliseconds(options_.idle_timeout_ms));
    beast_http::async_write(conn_->stream, req, [&](beast::error_code e, size_t) { ec = e; });
    if (!run()) return client_left();
    if (ec) {
      broken_ = true;
      stale_ = ec != beast::error::timeout;
      return unavailable("send to " + url + ": " + ec.message());
    }
    const int64_t sent_ns = steady_now_ns();
    conn_->stream.expires_after(std::chrono::milliseconds(options_.idle_timeout_ms));
    beast_http::async_read_header(conn_->stream, conn_->buffer, *parser_,
                                  [&](beast::error_code e, size_t) { ec = e; });
    if (!run()) return client_left();
    if (ec) {
      broken_ = true;
      const bool closed = ec == beast_http::error::end_of_stream || ec == asio::error::eof ||
                          ec == asio::error::connection_reset || ec == asio::error::broken_pipe;
      stale_ = closed && conn_->buffer.size() == 0 && !parser_->got_some() &&
               steady_now_ns() - sent_ns < int64_t{options_.connect_timeout_ms} * 1000000;
      return unavailable("answer from " + url + ": " + ec.message());
    }
    return Status::ok();
  }

  // Runs the operation queued; false when the client left meanwhile (the connection is closed).
  bool run() {
    asio::io_context& ioc = conn_->ioc;
    ioc.restart();
    if (!client_gone_) {
      ioc.run();
      return true;
    }
    while (!ioc.stopped()) {
      ioc.run_for(std::chrono::milliseconds(50));
      if (!ioc.stopped() && client_gone_()) {
        beast::error_code ignored;
        conn_->stream.socket().close(ignored);
        broken_ = true;
        ioc.run();  // the operation ends, aborted
        return false;
      }
    }
    return true;
  }
  static Status client_left() {
    return Status(StatusCode::kCancelled, "the client went away before the worker answered");
  }
  const RouterOptions& options_;
  WorkerConnections* pool_;
  std::function<bool()> client_gone_;
  std::unique_ptr<WorkerConnection> conn_;
  bool broken_ = false;  // the connection may not carry another request
  bool stale_ = false;   // the last exchange failed as on a connection closed before it began
  std::optional<beast_http::response_parser<beast_http::buffer_body>> parser_;
};

}  // namespace hr::api
