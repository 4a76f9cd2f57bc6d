// The HTTP server: keep-alive, graceful stop (in-flight requests finish, new ones are refused),
// the body limit and the larger one for uploads (decided from the header, with 100-continue), and
// sized streams that close the connection when they end short.
#include "api/http_server.h"

#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <atomic>
#include <thread>

#include "tests/testing/http_client.h"

namespace hr::api {
namespace {

namespace http = boost::beast::http;

TEST(HttpServerTest, StopFinishesInFlightRequestsThenRefusesNewOnes) {
  std::atomic<int> started{0};
  HttpServerOptions o;
  o.port = 0;
  o.body_limit_bytes = 1024;
  HttpServer server(o, [&](const HttpRequest& req) {
    ++started;
    if (req.target() == "/slow") std::this_thread::sleep_for(std::chrono::milliseconds(400));
    return json_response(200, "{\"ok\":true}");
  });
  ASSERT_TRUE(server.start().is_ok());
  int port = server.port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(testing::http_call("GET", port, "/fast").status, 200);
  auto big = testing::http_call("POST", port, "/fast", std::string(4096, 'x'));
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(big.json()["errors"][0]["field"], "body");

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

// Sends `request` on a raw connection and returns what comes back until the server closes it or
// `until` appears.
std::string raw_exchange(int port, const std::string& request, const std::string& until = "") {
  namespace asio = boost::asio;
  asio::io_context ioc;
  asio::ip::tcp::socket socket(ioc);
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  asio::write(socket, asio::buffer(request));
  std::string got;
  char buf[4096];
  for (;;) {
    boost::system::error_code ec;
    size_t n = socket.read_some(asio::buffer(buf), ec);
    got.append(buf, n);
    if (ec || (!until.empty() && got.find(until) != std::string::npos)) break;
  }
  return got;
}

TEST(HttpServerTest, UploadRoutesTakeLargerBodiesChosenFromTheHeader) {
  HttpServerOptions o;
  o.port = 0;
  o.body_limit_bytes = 1024;
  o.upload_limit_bytes = 64 * 1024;
  o.is_upload = [](http::verb m, std::string_view target) {
    return m == http::verb::post && target == "/upload";
  };
  o.too_large_body = [](std::string_view target, const Status& st) {
    return nlohmann::json{{"target", target}, {"message", st.message()}}.dump();
  };
  HttpServer server(o, [](const HttpRequest& req) {
    return json_response(200, nlohmann::json{{"bytes", req.body().size()}}.dump());
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
  HttpServerOptions o;
  o.port = 0;
  HttpServer server(o, StreamingHandler([](const HttpRequest& req) {
                      Reply r;
                      r.response = json_response(200, "");
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
  HttpServerOptions o;
  o.port = 0;
  std::atomic<int> seen{-1};  // -1: still waiting; then 1 gone, 0 not within 5 s
  std::atomic<bool> connected_at_first{false};
  HttpServer server(o, [&](const HttpRequest&) {
    connected_at_first = !current_client_gone();
    for (int i = 0; i < 500 && seen < 0; ++i) {
      if (current_client_gone()) seen = 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (seen < 0) seen = 0;
    return json_response(200, "{}");
  });
  ASSERT_TRUE(server.start().is_ok());
  EXPECT_FALSE(current_client_gone());  // not a handler thread
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  socket.connect({boost::asio::ip::make_address("127.0.0.1"), server.port()});
  std::string req = "GET /wait HTTP/1.1\r\nHost: x\r\n\r\n";
  boost::asio::write(socket, boost::asio::buffer(req));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  socket.close();
  for (int i = 0; i < 600 && seen < 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(connected_at_first);
  EXPECT_EQ(seen.load(), 1);
  server.stop();
}

}  // namespace
}  // namespace hr::api
