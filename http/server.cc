// Beast plumbing: acceptor, sessions, the handler pool.
#include "http/server.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "http/status.h"

namespace hr::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace beast_http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// {"error": {"code", "message", "field"?}}: for servers that choose no shape of their own.
std::string default_error_body(const Status& st) {
  nlohmann::json body = {
      {"error", {{"code", status_code_name(st.code())}, {"message", st.message()}}}};
  if (!st.field().empty()) body["error"]["field"] = st.field();
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

HttpResponse json_response(unsigned status, const std::string& body, unsigned version,
                           bool keep_alive) {
  HttpResponse res{static_cast<beast_http::status>(status), version};
  res.set(beast_http::field::content_type, "application/json");
  res.set(beast_http::field::server, "headroom");
  res.keep_alive(keep_alive);
  res.body() = body;
  res.prepare_payload();
  return res;
}

namespace {

// What stop() may ask of an open connection, from any thread: to shut its socket on its own
// strand (all, or only if it waits for a request), then call `done`.
class OpenConnection {
 public:
  virtual ~OpenConnection() = default;
  virtual void shut(bool idle_only, std::function<void()> done) = 0;
};

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  StreamingHandler handler;
  // Before the io_context: connections its destruction frees still count themselves out.
  std::atomic<int> in_flight{0};  // requests read in full and not yet answered
  std::atomic<bool> stopping{false};
  // Open connections (for the cap, and so that stop() can end them). Guarded by open_mu.
  std::mutex open_mu;
  std::unordered_map<const void*, std::weak_ptr<OpenConnection>> open_connections;
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  // On its own strand: accepting and closing (at stop) never run at the same time.
  tcp::acceptor acceptor{asio::make_strand(ioc)};
  asio::steady_timer accept_retry{acceptor.get_executor()};  // on the acceptor's strand
  int64_t last_accept_warning_ns = 0;                        // on the acceptor's strand
  asio::thread_pool pool;
  std::vector<std::thread> threads;

  Impl(HttpServerOptions o, StreamingHandler h)
      : options(std::move(o)),
        handler(std::move(h)),
        pool(static_cast<size_t>(options.handler_threads)) {}

  void do_accept();
  // Shuts the sockets of the open connections down (those waiting for a request, or all), so that
  // they end and their clients see them closed rather than silent. Waits (up to a second) until
  // each has done so, so that it happens before the io threads stop.
  void shut_connections(bool idle_only) {
    std::vector<std::shared_ptr<OpenConnection>> open;
    {
      std::lock_guard<std::mutex> lock(open_mu);
      for (const auto& [key, weak] : open_connections) {
        if (auto c = weak.lock()) open.push_back(std::move(c));
      }
    }
    if (open.empty()) return;
    auto left = std::make_shared<std::atomic<size_t>>(open.size());
    auto all_done = std::make_shared<std::promise<void>>();
    std::future<void> finished = all_done->get_future();
    for (auto& s : open) {
      s->shut(idle_only, [left, all_done] {
        if (--*left == 0) all_done->set_value();
      });
    }
    open.clear();
    finished.wait_for(std::chrono::seconds(1));
  }
  // The body of one of the server's own refusals to a request for `target`.
  std::string refusal_body(std::string_view target, const Status& st) const {
    return options.error_body_for ? options.error_body_for(target, st) : default_error_body(st);
  }
  // The answer to a request whose handler (or header check) threw.
  HttpResponse internal_error_response(const HttpRequest& req) const {
    std::string_view target(req.target().data(), req.target().size());
    Status st = internal_error("internal error");
    return json_response(http_status_for(st.code()), refusal_body(target, st));
  }
};

namespace {

// The most a request's header may take (the request line and every field): more is 431.
constexpr uint32_t kHeaderLimitBytes = 16 * 1024;

// Where a request's header ends ("\n\r\n", or "\n\n" that the parser refuses) or where a line of
// it starts with a space or tab: obsolete line folding (RFC 9112 section 5.2), refused with a 400
// rather than joined as Beast would, so that no field means one thing here and another to a proxy
// in front. The header is read up to this point before it is parsed; not found, the first of the
// pointer is where to look again when more has come.
std::pair<const char*, bool> header_end_or_fold(const char* begin, const char* end) {
  for (const char* it = begin; it != end; ++it) {
    if (*it != '\n') continue;
    const char* next = it;
    if (++next == end) return {it, false};  // look again from this '\n' when more comes
    if (*next == '\n' || *next == ' ' || *next == '\t') return {++next, true};
    if (*next != '\r') continue;
    if (++next == end) return {it, false};
    if (*next == '\n') return {++next, true};
  }
  return {end, false};
}

// Whether a header read up to header_end_or_fold stopped at a folded line, not at its end.
bool ends_in_fold(std::string_view header) {
  return !header.empty() && (header.back() == ' ' || header.back() == '\t');
}

// The socket of the request whose handler runs on this thread (-1: none).
thread_local int t_client_fd = -1;

// Sets t_client_fd for the life of a handler call.
class ClientScope {
 public:
  explicit ClientScope(int fd) { t_client_fd = fd; }
  ~ClientScope() { t_client_fd = -1; }
  ClientScope(const ClientScope&) = delete;
  ClientScope& operator=(const ClientScope&) = delete;
};

class Session : public OpenConnection, public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, HttpServer::Impl* server)
      : stream_(std::move(socket)), server_(server) {}
  ~Session() override {
    {
      std::lock_guard<std::mutex> lock(server_->open_mu);
      server_->open_connections.erase(this);
    }
    settle();
  }

  void shut(bool idle_only, std::function<void()> done) override {
    asio::post(stream_.get_executor(),
               [self = shared_from_this(), idle_only, done = std::move(done)] {
                 if (!idle_only || self->idle_) {
                   beast::error_code ignored;  // already closed (a timeout, say): nothing to do
                   self->stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
                 }
                 done();
               });
  }

  void start() {
    size_t open = 0;
    {
      std::lock_guard<std::mutex> lock(server_->open_mu);
      server_->open_connections[this] = weak_from_this();
      open = server_->open_connections.size();
    }
    const bool over_cap = open > static_cast<size_t>(server_->options.max_connections);
    asio::dispatch(stream_.get_executor(), [self = shared_from_this(), over_cap] {
      if (over_cap) {
        metrics::counter("headroom_http_connections_refused_total",
                         "Connections answered 503 because max_connections were open")
            .add();
        Status st = unavailable("too many connections; try again shortly");
        HttpResponse res = json_response(http_status_for(st.code()),
                                         self->server_->refusal_body("", st), 11, false);
        res.set(beast_http::field::retry_after, "1");
        return self->refuse(std::move(res));
      }
      self->do_read();
    });
  }

 private:
  // Reads the header first: the body limit depends on the route (uploads may be larger).
  void do_read() {
    if (server_->stopping) return close();
    const HttpServerOptions& o = server_->options;
    parser_.emplace();
    parser_->header_limit(kHeaderLimitBytes);
    parser_->body_limit(std::max(o.body_limit_bytes, o.upload_limit_bytes));
    stream_.expires_after(std::chrono::seconds(o.read_timeout_s));
    idle_ = true;
    // The header's bytes are looked at before the parser sees them (for folded lines).
    scanned_ = 0;
    read_header_bytes();
  }

  // Reads until the buffer holds a whole header (or up to a folded line), then parses it; past
  // the header's limit, 431.
  void read_header_bytes() {
    const char* seen = static_cast<const char*>(buffer_.data().data());
    const size_t size = buffer_.size();
    auto [stop, found] = header_end_or_fold(seen + scanned_, seen + size);
    if (found) return on_header_bytes(std::string_view(seen, static_cast<size_t>(stop - seen)));
    scanned_ = static_cast<size_t>(stop - seen);
    constexpr size_t kMost = kHeaderLimitBytes + 4;  // the parser's limit and the blank line
    if (size >= kMost) {
      idle_ = false;
      return protocol_error(431, "the request's header is larger than " +
                                     std::to_string(kHeaderLimitBytes) + " bytes");
    }
    stream_.async_read_some(buffer_.prepare(std::min<size_t>(kMost - size, 4096)),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) return self->close();
                              self->buffer_.commit(n);
                              self->read_header_bytes();
                            });
  }

  void on_header_bytes(std::string_view header) {
    if (ends_in_fold(header)) {
      idle_ = false;
      return protocol_error(400,
                            "a header line starts with a space or tab (obsolete line folding, "
                            "RFC 9112 section 5.2): send each field on one line");
    }
    beast_http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // Whether the request whose header was read is an upload (larger body, longer to arrive).
  bool is_upload() const {
    const HttpServerOptions& o = server_->options;
    const auto& header = parser_->get();
    std::string_view target(header.target().data(), header.target().size());
    return o.is_upload && o.upload_limit_bytes > 0 && o.is_upload(header.method(), target);
  }

  void on_header(beast::error_code ec) {
    idle_ = false;
    const HttpServerOptions& o = server_->options;
    // A request the parser refused gets an answer that says why (a client that only sees the
    // connection close cannot tell a bad request from a network fault); a connection that ended
    // or timed out is closed.
    if (ec == beast_http::error::header_limit) {
      return protocol_error(431, "the request's header is larger than " +
                                     std::to_string(kHeaderLimitBytes) + " bytes");
    }
    if (ec == beast_http::error::bad_version) {
      return protocol_error(505, "this HTTP version is not supported: send HTTP/1.1");
    }
    if (ec && ec != beast_http::error::body_limit &&
        ec.category() == beast_http::make_error_code(beast_http::error::end_of_stream).category() &&
        ec != beast_http::error::end_of_stream && ec != beast_http::error::partial_message) {
      return protocol_error(400, "malformed HTTP request: " + ec.message());
    }
    // body_limit here: a Content-Length over even the upload limit (the header is parsed).
    if (ec && ec != beast_http::error::body_limit) return close();
    if (const unsigned v = parser_->get().version(); v != 10 && v != 11) {
      return protocol_error(505, "HTTP/" + std::to_string(v / 10) + "." + std::to_string(v % 10) +
                                     " is not supported: send HTTP/1.1");
    }
    upload_ = is_upload();
    limit_ = upload_ ? o.upload_limit_bytes : o.body_limit_bytes;
    if (ec || (parser_->content_length() && *parser_->content_length() > limit_)) {
      return too_large(limit_);
    }
    parser_->body_limit(limit_);  // for chunked bodies, counted as they arrive
    if (!o.check_header || parser_->is_done()) return expect_body();
    // The check may block (a key looked up in the database): it runs on the handler pool while
    // no read or write of this connection is under way.
    asio::post(server_->pool, [self = shared_from_this()] {
      std::optional<HttpResponse> early;
      try {
        ClientScope client(self->stream_.socket().native_handle());
        early = self->server_->options.check_header(self->parser_->get());
      } catch (const std::exception& e) {
        log::error("http.check_header_exception", {{"error", e.what()}});
        early = self->server_->internal_error_response(self->parser_->get());
      }
      asio::post(self->stream_.get_executor(), [self, early = std::move(early)]() mutable {
        if (!early) return self->expect_body();
        early->version(self->parser_->get().version());
        self->refuse(std::move(*early));  // the body is never read
      });
    });
  }

  // Reads the body, first telling a client that waits for it (Expect: 100-continue) to send it.
  void expect_body() {
    // From now: the time for the body starts after the header's check, however long that took.
    const HttpServerOptions& o = server_->options;
    stream_.expires_after(
        std::chrono::seconds(upload_ ? o.upload_read_timeout_s : o.read_timeout_s));
    const auto& header = parser_->get();
    auto expect = header.find(beast_http::field::expect);
    if (expect != header.end() && beast::iequals(expect->value(), "100-continue")) {
      // Tell the client to send the body now rather than after its own timeout (curl waits 1 s).
      auto cont = std::make_shared<beast_http::response<beast_http::empty_body>>(
          beast_http::status::continue_, 11);
      beast_http::async_write(stream_, *cont,
                              [self = shared_from_this(), cont](beast::error_code ec, size_t) {
                                if (ec) return self->close();
                                self->read_body();
                              });
      return;
    }
    read_body();
  }

  void read_body() {
    beast_http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  // Answers a request the parser refused (400, 431, 505) and closes the connection.
  void protocol_error(int status, const std::string& message) {
    Status st = invalid_argument(message, status == 431 ? "header" : "request");
    std::string body = server_->refusal_body("", st);
    refuse(json_response(status, std::move(body), 11, false));
  }

  // Answers 413 and closes the connection (the rest of the body is not read).
  void too_large(size_t limit) {
    Status st(StatusCode::kTooLarge,
              "request body is larger than the limit of " + std::to_string(limit) + " bytes",
              "body");
    const auto& header = parser_->get();
    std::string_view target(header.target().data(), header.target().size());
    refuse(json_response(http_status_for(st.code()), server_->refusal_body(target, st), 11, false));
  }

  void on_read(beast::error_code ec) {
    if (ec == beast_http::error::body_limit) return too_large(limit_);
    if (ec) return close();
    HttpRequest req = parser_->release();
    // Counted before `stopping` is read, and stop() sets `stopping` before it reads the count:
    // either stop() waits for this request, or the request sees the server stopping.
    counted_ = true;
    ++server_->in_flight;
    if (server_->stopping) {
      std::string_view target(req.target().data(), req.target().size());
      Status st = unavailable("the server is shutting down; send the request again");
      return write(json_response(http_status_for(st.code()), server_->refusal_body(target, st),
                                 req.version(), false));
    }
    asio::post(server_->pool, [self = shared_from_this(), req = std::move(req)]() mutable {
      Reply reply;
      try {
        ClientScope client(self->stream_.socket().native_handle());
        reply = self->server_->handler(req);
      } catch (const std::exception& e) {
        log::error("http.handler_exception", {{"error", e.what()}});
        reply.response = self->server_->internal_error_response(req);
        reply.stream = nullptr;
      }
      HttpResponse& res = reply.response;
      res.version(req.version());
      res.keep_alive(req.keep_alive() && res.keep_alive() && !self->server_->stopping);
      if (reply.stream) {
        auto out = std::make_shared<Outgoing>();
        out->next = std::move(reply.stream);
        out->bytes = reply.stream_bytes;
        asio::post(self->stream_.get_executor(), [self, res = std::move(res), out]() mutable {
          self->start_stream(std::move(res), out);
        });
        return;
      }
      asio::post(self->stream_.get_executor(),
                 [self, res = std::move(res)]() mutable { self->write(std::move(res)); });
    });
  }

  // A streamed body on its way out.
  struct Outgoing {
    BodyStream next;
    std::optional<uint64_t> bytes;  // sized: sent as is with a Content-Length; else chunked
    uint64_t sent = 0;
    bool keep_alive = false;
  };

  // Streams: the header (chunked, or with the stream's Content-Length), then each piece the
  // stream yields (pulled on the handler pool, written on this connection's strand), then the
  // last chunk.
  void start_stream(HttpResponse res, std::shared_ptr<Outgoing> out) {
    auto header =
        std::make_shared<beast_http::response<beast_http::empty_body>>(res.result(), res.version());
    for (const auto& f : res) {
      if (f.name() == beast_http::field::content_length) continue;
      header->set(f.name_string(), f.value());
    }
    header->keep_alive(res.keep_alive());
    if (out->bytes) {
      header->content_length(*out->bytes);
    } else {
      header->chunked(true);
    }
    out->keep_alive = header->keep_alive();
    auto sr = std::make_shared<beast_http::response_serializer<beast_http::empty_body>>(*header);
    stream_.expires_after(std::chrono::seconds(server_->options.write_timeout_s));
    beast_http::async_write_header(
        stream_, *sr, [self = shared_from_this(), header, sr, out](beast::error_code ec, size_t) {
          if (ec) return self->end_stream(false);
          self->pump(out);
        });
  }

  void pump(std::shared_ptr<Outgoing> out) {
    asio::post(server_->pool, [self = shared_from_this(), out] {
      auto chunk = std::make_shared<std::string>();
      bool more = false, broken = false;
      try {
        more = out->next(chunk.get());
      } catch (const std::exception& e) {
        log::error("http.stream_exception", {{"error", e.what()}});
        broken = true;
      }
      asio::post(self->stream_.get_executor(), [self, out, chunk, more, broken]() mutable {
        // Cut off without its end, so that the client sees the body incomplete, not complete.
        if (broken) return self->end_stream(false);
        self->stream_.expires_after(std::chrono::seconds(self->server_->options.write_timeout_s));
        auto written = [self, out, chunk](beast::error_code ec, size_t) {
          if (ec) return self->end_stream(false);
          self->pump(out);
        };
        if (out->bytes) {
          if (more && out->sent + chunk->size() > *out->bytes) more = false;  // never overrun
          if (!more) return self->end_stream(out->keep_alive && out->sent == *out->bytes);
          out->sent += chunk->size();
          asio::async_write(self->stream_, asio::buffer(*chunk), written);
          return;
        }
        if (!more) {
          asio::async_write(self->stream_, beast_http::make_chunk_last(),
                            [self, out](beast::error_code ec, size_t) {
                              self->end_stream(!ec && out->keep_alive);
                            });
          return;
        }
        // An empty piece is no chunk (a zero-size chunk would end the body): ask for the next.
        if (chunk->empty()) return self->pump(out);
        asio::async_write(self->stream_, beast_http::make_chunk(asio::buffer(*chunk)), written);
      });
    });
  }

  void end_stream(bool keep_alive) {
    settle();
    if (keep_alive && !server_->stopping) return do_read();
    close();
  }

  void write(HttpResponse res, bool linger = false) {
    auto sp = std::make_shared<HttpResponse>(std::move(res));
    stream_.expires_after(std::chrono::seconds(server_->options.write_timeout_s));
    beast_http::async_write(stream_, *sp,
                            [self = shared_from_this(), sp, linger](beast::error_code ec, size_t) {
                              self->settle();  // answered: stop() need not wait for it any longer
                              if (!ec && linger) return self->linger();
                              if (ec || !sp->keep_alive()) return self->close();
                              self->do_read();
                            });
  }

  // Answers a request whose body (or all of it) was not read, and closes.
  void refuse(HttpResponse res) {
    res.keep_alive(false);
    write(std::move(res), /*linger=*/true);
  }

  // Closes after a refusal: the sending side first, then what the client still sends is read and
  // dropped, so that unread bytes do not turn the close into a reset, which can destroy the answer
  // before the client has read it. A client that sends its whole body before it reads (Python's
  // http.client, most simple clients) thus reads an early 413 or 401. Bounded as nginx's
  // lingering close is: kLingerBytes in all, kLingerTotal in all, kLingerIdle between reads.
  static constexpr size_t kLingerBytes = size_t{64} << 20;
  static constexpr auto kLingerTotal = std::chrono::seconds(10);
  static constexpr auto kLingerIdle = std::chrono::seconds(2);
  void linger() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    discard(std::make_shared<std::vector<char>>(65536), 0,
            std::chrono::steady_clock::now() + kLingerTotal);
  }
  void discard(std::shared_ptr<std::vector<char>> buf, size_t dropped,
               std::chrono::steady_clock::time_point until) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) return;
    stream_.expires_after(std::min<std::chrono::steady_clock::duration>(kLingerIdle, until - now));
    stream_.async_read_some(asio::buffer(*buf), [self = shared_from_this(), buf, dropped, until](
                                                    beast::error_code ec, size_t n) {
      if (!ec && dropped + n < kLingerBytes) self->discard(buf, dropped + n, until);
    });
  }

  // The request being answered is no longer in flight.
  void settle() {
    if (counted_) {
      counted_ = false;
      --server_->in_flight;
    }
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  size_t scanned_ = 0;  // how much of buffer_ read_header_bytes() has looked at
  std::optional<beast_http::request_parser<beast_http::string_body>> parser_;
  size_t limit_ = 0;      // the body limit of the request being read
  bool upload_ = false;   // the request being read is an upload
  bool counted_ = false;  // the request being answered is counted in server_->in_flight
  bool idle_ = false;     // waiting for a request's header
  HttpServer::Impl* server_;
};

}  // namespace

void HttpServer::Impl::do_accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (!acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors or memory: the connection stays queued, so accepting again at
      // once would fail again at once, in a loop. Wait a moment instead.
      int64_t now = steady_now_ns();
      if (now - last_accept_warning_ns > 10'000'000'000) {
        last_accept_warning_ns = now;
        log::warn("http.accept_failed", {{"error", ec.message()}});
      }
      accept_retry.expires_after(std::chrono::milliseconds(options.accept_retry_ms));
      accept_retry.async_wait([this](beast::error_code) { do_accept(); });
      return;
    }
    std::make_shared<Session>(std::move(socket), this)->start();
    do_accept();
  });
}

HttpServer::HttpServer(HttpServerOptions options, StreamingHandler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {}

HttpServer::HttpServer(HttpServerOptions options, Handler handler)
    : HttpServer(std::move(options),
                 StreamingHandler([h = std::move(handler)](const HttpRequest& r) {
                   return Reply{h(r), nullptr};
                 })) {}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  beast::error_code ec;
  auto address = asio::ip::make_address(impl_->options.host, ec);
  if (ec) return invalid_argument("bad listen address " + impl_->options.host, "host");
  tcp::endpoint ep{address, impl_->options.port};
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return unavailable("cannot listen on " + impl_->options.host + ":" +
                       std::to_string(impl_->options.port) + ": " + ec.message());
  }
  bound_port_ = impl_->acceptor.local_endpoint().port();
  impl_->work.emplace(impl_->ioc.get_executor());
  impl_->do_accept();
  for (int i = 0; i < impl_->options.io_threads; ++i) {
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  }
  return Status::ok();
}

void HttpServer::stop() {
  if (!impl_ || impl_->threads.empty() || impl_->stopping.exchange(true)) return;
  // Closed before stop() goes on: from here a new connection is refused, not left waiting.
  auto closed = std::make_shared<std::promise<void>>();
  std::future<void> acceptor_closed = closed->get_future();
  asio::post(impl_->acceptor.get_executor(), [this, closed] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
    impl_->accept_retry.cancel();
    closed->set_value();
  });
  acceptor_closed.wait_for(std::chrono::seconds(1));
  // Kept-alive connections between requests end now; their clients (the API's router, say) see
  // them closed and go elsewhere rather than send a request that would wait unanswered.
  impl_->shut_connections(/*idle_only=*/true);
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(impl_->options.drain_timeout_s);
  // A request counts until its answer is written, so none is cut off here unless it overran.
  while (impl_->in_flight.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  impl_->shut_connections(/*idle_only=*/false);
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  impl_->pool.join();
}

bool current_client_gone() {
  if (t_client_fd < 0) return false;
  char c;
  ssize_t n = ::recv(t_client_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  // 0: the peer closed its side. Bytes waiting (a pipelined request) or nothing yet: still there.
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

std::string current_client_address() {
  if (t_client_fd < 0) return "";
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(t_client_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof text);
    return text;
  }
  if (addr.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      ::inet_ntop(AF_INET, &a.s6_addr[12], text, sizeof text);
    } else {
      ::inet_ntop(AF_INET6, &a, text, sizeof text);
    }
    return text;
  }
  return "";
}

}  // namespace hr::http
