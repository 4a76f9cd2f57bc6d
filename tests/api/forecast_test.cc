// Forecasts on open batches over real HTTP, Postgres and Redis (api/queue_forecasts.h): none
// while the model's throughput is unknown; with it (as the dispatcher publishes it), the
// estimated completion at submit and on every poll, each queued request's queue_position, and a
// warning when the batch's deadline looks out of reach.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "base/clock.h"
#include "queue/open_work.h"
#include "queue/redis.h"
#include "tests/testing/api_harness.h"

namespace hr::api {
namespace {

using nlohmann::json;
using testing::ApiHarness;
using testing::HttpResult;

json requests(int n) {
  json out = json::array();
  for (int i = 0; i < n; ++i) {
    out.push_back({{"messages", {{{"role", "user"}, {"content", "reverse: " + std::to_string(i)}}}},
                   {"max_tokens", 8}});
  }
  return out;
}

HttpResult submit(ApiHarness& h, const std::string& key, int n, const json& extra = {}) {
  json body = {{"requests", requests(n)}};
  if (extra.is_object()) body.update(extra);
  return h.post("/ai/run/" + h.model() + "?queueRequest=true", body.dump(), key);
}

void publish_rate(ApiHarness& h, double per_s) {
  auto redis = queue::RedisClient::connect(h.redis_url());
  ASSERT_TRUE(redis.is_ok());
  ASSERT_TRUE(queue::publish_model_rate(**redis, h.model(), per_s).is_ok());
}

int64_t now_s() { return SystemClock::instance().now_unix_ms() / 1000; }

TEST(ForecastTest, NoneWhileTheModelsThroughputIsUnknown) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  HttpResult r = submit(h, h.key_a(), 3);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(r.json()["result"].contains("estimated_completion_at")) << r.body;
  std::string id = r.json()["result"]["request_id"];
  HttpResult poll = h.get("/v1/async/" + id + "?include=partial", h.key_a());
  ASSERT_EQ(poll.status, 200) << poll.body;
  EXPECT_FALSE(poll.json()["result"].contains("estimated_completion_at")) << poll.body;
  EXPECT_FALSE(poll.json()["result"]["responses"][0].contains("queue_position")) << poll.body;
}

// No workers take anything here, so the queue stands still and the forecast is exact: account
// a's 30 requests ahead, account b's 20 sharing the rate with them one for one.
TEST(ForecastTest, EstimatedAtSubmitAndOnEveryPollWithQueuePositions) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  publish_rate(h, 2);
  HttpResult a = submit(h, h.key_a(), 30);
  ASSERT_EQ(a.status, 200) << a.body;
  // Alone: 30 requests at 2 a second.
  int64_t t = now_s();
  ASSERT_TRUE(a.json()["result"].contains("estimated_completion_at")) << a.body;
  EXPECT_NEAR(a.json()["result"]["estimated_completion_at"].get<int64_t>(), t + 15, 1) << a.body;
  HttpResult b = submit(h, h.key_b(), 20);
  ASSERT_EQ(b.status, 200) << b.body;
  // b's 20 and as many of a's: 40 requests at 2 a second.
  t = now_s();
  EXPECT_NEAR(b.json()["result"]["estimated_completion_at"].get<int64_t>(), t + 20, 1) << b.body;
  EXPECT_FALSE(b.json()["result"].contains("warnings")) << b.body;
  std::string id = b.json()["result"]["request_id"];
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the view is read again
  HttpResult summary = h.get("/v1/async/" + id, h.key_b());
  ASSERT_EQ(summary.status, 200) << summary.body;
  EXPECT_NEAR(summary.json()["result"]["estimated_completion_at"].get<int64_t>(), now_s() + 20, 1)
      << summary.body;
  HttpResult poll = h.get("/v1/async/" + id + "?include=partial", h.key_b());
  ASSERT_EQ(poll.status, 200) << poll.body;
  const json polled = poll.json();
  const json& responses = polled["result"]["responses"];
  ASSERT_EQ(responses.size(), 20u) << poll.body;
  for (int j = 0; j < 20; ++j) {
    // One of a's before each of b's: b's j-th request goes after 2j others.
    EXPECT_EQ(responses[j]["queue_position"], 2 * j) << responses[j].dump();
  }
  // a's big batch ends last, after everything queued.
  std::string a_id = a.json()["result"]["request_id"];
  HttpResult a_poll = h.get("/v1/async/" + a_id, h.key_a());
  EXPECT_NEAR(a_poll.json()["result"]["estimated_completion_at"].get<int64_t>(), now_s() + 25, 1)
      << a_poll.body;
}

TEST(ForecastTest, ADeadlineOutOfReachIsAcceptedWithAWarning) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  publish_rate(h, 1);
  HttpResult r = submit(h, h.key_a(), 100, {{"completion_window", "30s"}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json answer = r.json();
  const json& result = answer["result"];
  EXPECT_EQ(result["status"], "queued");
  ASSERT_TRUE(result.contains("warnings")) << r.body;
  EXPECT_EQ(result["warnings"][0]["code"], "deadline_at_risk") << r.body;
  EXPECT_NE(result["warnings"][0]["message"].get<std::string>().find("deadline"),
            std::string::npos);
  std::string id = result["request_id"];
  HttpResult poll = h.get("/v1/async/" + id, h.key_a());
  EXPECT_EQ(poll.json()["result"]["warnings"][0]["code"], "deadline_at_risk") << poll.body;
  // A window it can meet: no warning.
  HttpResult fine = submit(h, h.key_b(), 10, {{"completion_window", "1h"}});
  ASSERT_EQ(fine.status, 200) << fine.body;
  EXPECT_TRUE(fine.json()["result"].contains("estimated_completion_at")) << fine.body;
  EXPECT_FALSE(fine.json()["result"].contains("warnings")) << fine.body;
}

}  // namespace
}  // namespace hr::api
