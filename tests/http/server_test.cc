// The HTTP server: keep-alive, graceful stop (in-flight requests finish, new ones are refused),
// the body limit and the larger one for uploads (decided from the header, with 100-continue), and
// sized streams that close the connection when they end short.
#include "http/server.h"

#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/testing/http_client.h"

namespace hr::api {
namespace {

namespace beast_http = boost::beast::http;

// A server on a free port that counts the requests it handles; /slow takes `slow_ms`.
struct CountingServer {
  std::atomic<int> handled{0};
  std::atomic<bool> slow_done{false};  // a /slow request has been handled
  http::HttpServer server;
  CountingServer(http::HttpServerOptions o, int slow_ms)
      : server(with_free_port(std::move(o)), [this, slow_ms](const http::HttpRequest& req) {
          ++handled;
          if (req.target() == "/slow") {
            std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
            slow_done = true;
          }
          return http::json_response(200, "{\"ok\":true}");
        }) {}
  static http::HttpServerOptions with_free_port(http::HttpServerOptions o) {
    o.port = 0;
    return o;
  }
};

TEST(HttpServerTest, StopFinishesInFlightRequestsThenRefusesNewOnes) {
  http::HttpServerOptions o;
  o.body_limit_bytes = 1024;
  CountingServer counting(o, 400);
  http::HttpServer& server = counting.server;
  std::atomic<int>& started = counting.handled;
  ASSERT_TRUE(server.start().is_ok());
  int port = server.port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(testing::http_call("GET", port, "/fast").status, 200);
  auto big = testing::http_call("POST", port, "/fast", std::string(4096, 'x'));
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(big.json()["error"]["field"], "body");  // the server's own shape: no error_body_for

  testing::HttpResult slow;
  std::thread client([&] { slow = testing::http_call("GET", port, "/slow"); });
  while (started.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto t0 = std::chrono::steady_clock::now();
  server.stop();  // must wait for /slow
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  client.join();
  EXPECT_EQ(slow.status, 200) << slow.body;
  EXPECT_GT(waited, 0.2);
  EXPECT_EQ(testing::http_call("GET", port, "/fast").status, 0);  // no longer accepting
}

using testing::RawConnection;

// Sends `request` on a raw connection and returns what comes back until the server closes it or
// `until` appears.
std::string raw_exchange(int port, const std::string& request, const std::string& until = "") {
  RawConnection c(port);
  c.send(request);
  return c.receive(until);
}

TEST(HttpServerTest, UploadRoutesTakeLargerBodiesChosenFromTheHeader) {
  http::HttpServerOptions o;
  o.port = 0;
  o.body_limit_bytes = 1024;
  o.upload_limit_bytes = 64 * 1024;
  o.is_upload = [](beast_http::verb m, std::string_view target) {
    return m == beast_http::verb::post && target == "/upload";
  };
  o.error_body_for = [](std::string_view target, const Status& st) {
    return nlohmann::json{{"target", target}, {"message", st.message()}}.dump();
  };
  http::HttpServer server(o, [](const http::HttpRequest& req) {
    return http::json_response(200, nlohmann::json{{"bytes", req.body().size()}}.dump());
  });
  ASSERT_TRUE(server.start().is_ok());
  int port = server.port();
  auto up = testing::http_call("POST", port, "/upload", std::string(32 * 1024, 'x'));
  EXPECT_EQ(up.status, 200) << up.body;
  EXPECT_EQ(up.json()["bytes"], 32 * 1024);
  auto other = testing::http_call("POST", port, "/other", std::string(4096, 'x'));
  EXPECT_EQ(other.status, 413);
  EXPECT_EQ(other.json()["target"], "/other");
  // Over the upload limit: refused from the header alone, before any of the body is sent.
  std::string refused =
      raw_exchange(port, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n");
  EXPECT_EQ(refused.rfind("HTTP/1.1 413", 0), 0u) << refused;
  EXPECT_NE(refused.find("\"target\":\"/upload\""), std::string::npos) << refused;
  // Over even the upload limit on another route: the answer names that route's own limit.
  std::string other_refused =
      raw_exchange(port, "POST /other HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n");
  EXPECT_EQ(other_refused.rfind("HTTP/1.1 413", 0), 0u) << other_refused;
  EXPECT_NE(other_refused.find("limit of 1024 bytes"), std::string::npos) << other_refused;
  // Expect: 100-continue gets its interim answer, then the body is read.
  std::string cont = raw_exchange(port,
                                  "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n"
                                  "Expect: 100-continue\r\n\r\n",
                                  "\r\n\r\n");
  EXPECT_EQ(cont.rfind("HTTP/1.1 100 Continue", 0), 0u) << cont;
  // A chunked body over the limit is cut off as it arrives.
  std::string chunked = raw_exchange(
      port, "POST /other HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" +
                std::string(2048, 'y') + "\r\n0\r\n\r\n");
  EXPECT_EQ(chunked.rfind("HTTP/1.1 413", 0), 0u) << chunked;
}

TEST(HttpServerTest, SizedStreamsSendContentLengthAndCloseWhenShort) {
  http::HttpServerOptions o;
  o.port = 0;
  http::HttpServer server(o, http::StreamingHandler([](const http::HttpRequest& req) {
                            http::Reply r;
                            r.response = http::json_response(200, "");
                            auto pieces = std::make_shared<int>(0);
                            bool short_body = req.target() == "/short";
                            r.stream_bytes = 10;
                            r.stream = [pieces, short_body](std::string* out) {
                              if (*pieces == (short_body ? 1 : 2)) return false;
                              ++*pieces;
                              *out = "hello";
                              return true;
                            };
                            return r;
                          }));
  ASSERT_TRUE(server.start().is_ok());
  auto full = testing::http_call("GET", server.port(), "/full");
  EXPECT_EQ(full.status, 200);
  EXPECT_EQ(full.body, "hellohello");
  EXPECT_EQ(full.headers["Content-Length"], "10");
  EXPECT_EQ(full.headers.count("Transfer-Encoding"), 0u);
  auto cut = testing::http_call("GET", server.port(), "/short");
  EXPECT_EQ(cut.status, 0) << "a body cut short must not look complete";
}

TEST(HttpServerTest, HandlersSeeTheirClientHangUp) {
  http::HttpServerOptions o;
  o.port = 0;
  std::atomic<int> seen{-1};  // -1: still waiting; then 1 gone, 0 not within 5 s
  std::atomic<bool> connected_at_first{false};
  http::HttpServer server(o, [&](const http::HttpRequest&) {
    connected_at_first = !http::current_client_gone();
    for (int i = 0; i < 500 && seen < 0; ++i) {
      if (http::current_client_gone()) seen = 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (seen < 0) seen = 0;
    return http::json_response(200, "{}");
  });
  ASSERT_TRUE(server.start().is_ok());
  EXPECT_FALSE(http::current_client_gone());  // not a handler thread
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  socket.connect({boost::asio::ip::make_address("127.0.0.1"), server.port()});
  std::string req = "GET /wait HTTP/1.1\r\nHost: x\r\n\r\n";
  boost::asio::write(socket, boost::asio::buffer(req));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  socket.close();
  for (int i = 0; i < 600 && seen < 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(connected_at_first);
  EXPECT_EQ(seen.load(), 1);
  server.stop();
}

// A request whose body arrives only after stop() began is answered 503 and never handled: its
// client would not hear of the work otherwise. The request in flight still finishes.
TEST(HttpServerTest, ARequestReadAfterStopBeganGets503AndIsNotHandled) {
  CountingServer counting({}, 500);
  http::HttpServer& server = counting.server;
  std::atomic<int>& handled = counting.handled;
  ASSERT_TRUE(server.start().is_ok());
  int port = server.port();
  RawConnection late(port);
  late.send("POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n");  // body to come
  testing::HttpResult slow;
  std::thread client([&] { slow = testing::http_call("GET", port, "/slow"); });
  while (handled.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::thread stopper([&] { server.stop(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  late.send("hello");
  std::string answer = late.receive();
  stopper.join();
  client.join();
  EXPECT_EQ(answer.rfind("HTTP/1.1 503", 0), 0u) << answer;
  EXPECT_NE(answer.find("shutting down"), std::string::npos) << answer;
  EXPECT_EQ(slow.status, 200);
  EXPECT_EQ(handled.load(), 1);
}

// stop() closes the listener before it returns, and ends kept-alive connections that wait for a
// request at once, so that their clients go elsewhere, while a request in flight still finishes.
TEST(HttpServerTest, StopClosesTheListenerAndIdleConnectionsAtOnce) {
  CountingServer counting({}, 800);
  http::HttpServer& server = counting.server;
  std::atomic<int>& handled = counting.handled;
  std::atomic<bool>& slow_done = counting.slow_done;
  ASSERT_TRUE(server.start().is_ok());
  int port = server.port();
  RawConnection idle(port, 5000);
  idle.send("GET /fast HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string first = idle.receive("{\"ok\":true}");
  ASSERT_EQ(first.rfind("HTTP/1.1 200", 0), 0u) << first;
  testing::HttpResult slow;
  std::thread client([&] { slow = testing::http_call("GET", port, "/slow"); });
  while (handled.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::thread stopper([&] { server.stop(); });
  std::string after = idle.receive();  // EOF: closed by the server
  const bool closed_while_slow_ran = !slow_done.load();
  EXPECT_EQ(after, "");
  EXPECT_TRUE(closed_while_slow_ran);
  stopper.join();
  client.join();
  EXPECT_EQ(slow.status, 200);
  EXPECT_EQ(testing::http_call("GET", port, "/fast").status, 0);  // refused
}

// The body's read timeout starts after the header's check, however long the check took.
TEST(HttpServerTest, ASlowHeaderCheckDoesNotUseUpTheBodysTime) {
  http::HttpServerOptions o;
  o.port = 0;
  o.read_timeout_s = 1;
  o.check_header = [](const http::HttpRequest&) -> std::optional<http::HttpResponse> {
    std::this_thread::sleep_for(std::chrono::milliseconds(1300));
    return std::nullopt;
  };
  http::HttpServer server(o, [&](const http::HttpRequest& req) {
    return http::json_response(200, nlohmann::json{{"bytes", req.body().size()}}.dump());
  });
  ASSERT_TRUE(server.start().is_ok());
  RawConnection c(server.port(), 5000);
  c.send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));
  c.send("hello");  // after the check, and more than read_timeout_s after the header
  std::string answer = c.receive();
  EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
  EXPECT_NE(answer.find("{\"bytes\":5}"), std::string::npos) << answer;
}

// Beyond max_connections a connection is answered 503 at once; once one closes, there is room.
TEST(HttpServerTest, ConnectionsBeyondTheCapAreRefusedWith503) {
  http::HttpServerOptions o;
  o.max_connections = 2;
  CountingServer counting(o, 0);
  http::HttpServer& server = counting.server;
  ASSERT_TRUE(server.start().is_ok());
  int port = server.port();
  auto first = std::make_unique<RawConnection>(port);
  RawConnection second(port);
  {
    RawConnection third(port);
    std::string refused = third.receive();
    EXPECT_EQ(refused.rfind("HTTP/1.1 503", 0), 0u) << refused;
    EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos) << refused;
    EXPECT_NE(refused.find("too many connections"), std::string::npos) << refused;
  }
  first.reset();  // the server sees it close and frees its place
  int status = 0;
  for (int i = 0; i < 100 && status != 200; ++i) {
    status = testing::http_call("GET", port, "/").status;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(status, 200);
}

// check_header answers from the header alone: a refused request's body is never read, and one it
// lets through is handled whole. Requests without a body are not checked.
TEST(HttpServerTest, CheckHeaderAnswersBeforeTheBodyIsRead) {
  std::atomic<int> checked{0}, handled{0};
  http::HttpServerOptions o;
  o.port = 0;
  o.body_limit_bytes = 4 << 20;
  o.check_header = [&](const http::HttpRequest& h) -> std::optional<http::HttpResponse> {
    ++checked;
    EXPECT_TRUE(h.body().empty());
    if (h.find(beast_http::field::authorization) == h.end())
      return http::json_response(401, "{\"who\":null}");
    return std::nullopt;
  };
  http::HttpServer server(o, [&](const http::HttpRequest& req) {
    ++handled;
    return http::json_response(200, nlohmann::json{{"bytes", req.body().size()}}.dump());
  });
  ASSERT_TRUE(server.start().is_ok());
  int port = server.port();
  // Refused from the header, though its 3 MB body never comes.
  RawConnection anon(port);
  anon.send("POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\n\r\n");
  std::string refused = anon.receive();
  EXPECT_EQ(refused.rfind("HTTP/1.1 401", 0), 0u) << refused;
  EXPECT_NE(refused.find("Connection: close"), std::string::npos) << refused;
  auto ok = testing::http_call("POST", port, "/up", std::string(3000, 'x'),
                               {{"Authorization", "Bearer k"}});
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.json()["bytes"], 3000);
  EXPECT_EQ(testing::http_call("GET", port, "/plain").status, 200);
  EXPECT_EQ(checked.load(), 2);
  EXPECT_EQ(handled.load(), 2);
}

// Requests the parser refuses get an answer that says why, not just a closed connection: an
// oversized header 431, a malformed one 400, an HTTP version other than 1.0/1.1 505.
TEST(HttpServerTest, ProtocolErrorsAreAnsweredNotJustClosed) {
  http::HttpServerOptions o;
  o.port = 0;
  http::HttpServer server(
      o, [](const http::HttpRequest&) { return http::json_response(200, "{\"ok\":true}"); });
  ASSERT_TRUE(server.start().is_ok());
  const int port = server.port();
  std::string big = raw_exchange(
      port, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(100 * 1024, 'b') + "\r\n\r\n");
  EXPECT_EQ(big.rfind("HTTP/1.1 431", 0), 0u) << big.substr(0, 200);
  EXPECT_NE(big.find("header"), std::string::npos) << big.substr(0, 400);
  std::string length =
      raw_exchange(port, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n");
  EXPECT_EQ(length.rfind("HTTP/1.1 400", 0), 0u) << length;
  EXPECT_NE(length.find("Content-Length"), std::string::npos) << length;
  std::string garbage = raw_exchange(port, "GET / HTTP/1.1\r\nHost x\r\n\r\n");
  EXPECT_EQ(garbage.rfind("HTTP/1.1 400", 0), 0u) << garbage;
  // Obsolete line folding: a continuation line is refused, not joined to the field above.
  std::string folded = raw_exchange(port, "GET / HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n");
  EXPECT_EQ(folded.rfind("HTTP/1.1 400", 0), 0u) << folded;
  EXPECT_NE(folded.find("folding"), std::string::npos) << folded;
  std::string tab = raw_exchange(port, "GET / HTTP/1.1\r\n\tHost: x\r\n\r\n");
  EXPECT_EQ(tab.rfind("HTTP/1.1 400", 0), 0u) << tab;
  // A header that arrives a byte at a time is read whole all the same.
  {
    RawConnection slow(port);
    for (char c :
         std::string("GET / HTTP/1.1\r\nHost: x\r\nX-A: b c\r\nConnection: close\r\n\r\n")) {
      slow.send(std::string(1, c));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::string answer = slow.receive();
    EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
  }
  std::string two = raw_exchange(port, "GET / HTTP/2.0\r\nHost: x\r\n\r\n");
  EXPECT_EQ(two.rfind("HTTP/1.1 505", 0), 0u) << two;
  // And the server goes on serving.
  EXPECT_EQ(testing::http_call("GET", port, "/").status, 200);
}

// A client that sends its whole body before it reads (as Python's http.client does) reads an
// early 413 and its error, though the body is 11 MB past a 1 MB limit: the server drains what
// still comes before it closes instead of resetting the connection under the answer.
TEST(HttpServerTest, AnEarly413IsReadByAClientThatSendsItsWholeBodyFirst) {
  http::HttpServerOptions o;
  o.port = 0;
  o.body_limit_bytes = 1 << 20;
  http::HttpServer server(
      o, [](const http::HttpRequest&) { return http::json_response(200, "{\"ok\":true}"); });
  ASSERT_TRUE(server.start().is_ok());
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const size_t body = 11 << 20;
  std::string data = "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body) +
                     "\r\n\r\n" + std::string(body, 'x');
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  EXPECT_EQ(sent, data.size()) << "the server reset the connection while the body was sent";
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) answer.append(buf, n);
  ::close(fd);
  EXPECT_EQ(answer.rfind("HTTP/1.1 413", 0), 0u) << answer.substr(0, 200);
  EXPECT_NE(answer.find("larger than the limit"), std::string::npos) << answer;
}

// Out of file descriptors, the acceptor waits between tries instead of spinning on the connection
// it cannot take, and serves again once descriptors are free.
TEST(HttpServerTest, AcceptingWithoutFileDescriptorsWaitsInsteadOfSpinning) {
  http::HttpServerOptions o;
  o.io_threads = 1;
  CountingServer counting(o, 0);
  http::HttpServer& server = counting.server;
  ASSERT_TRUE(server.start().is_ok());
  int port = server.port();
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  // The lowest free descriptor number is the count in use (near enough): allow none more.
  int probe = ::dup(0);
  ASSERT_GE(probe, 0);
  ::close(probe);
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(probe) + 1;  // the client's own socket, and no more
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  int client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(client, 0);
  timeval five_s{5, 0};
  setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &five_s, sizeof five_s);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);  // queued
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  getrusage(RUSAGE_SELF, &after);
  auto cpu_ms = [](const rusage& r) {
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000.0 +
           (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1000.0;
  };
  double spent = cpu_ms(after) - cpu_ms(before);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_LT(spent, 300.0) << "the acceptor spun for " << spent << " ms of CPU in 1 s";
  // With descriptors free again, the queued connection is taken and answered.
  std::string req = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::send(client, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  char buf[256];
  ssize_t n = ::recv(client, buf, sizeof buf, 0);
  ::close(client);
  ASSERT_GT(n, 12);
  EXPECT_EQ(std::string(buf, 12), "HTTP/1.1 200");
}

}  // namespace
}  // namespace hr::api
