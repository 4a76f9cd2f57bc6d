// The HTTP server: keep-alive, graceful stop (in-flight requests finish, new ones are refused)
// and the body limit.
#include "api/http_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/testing/http_client.h"

namespace hr::api {
namespace {

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

}  // namespace
}  // namespace hr::api
