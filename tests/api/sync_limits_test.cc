// Accounts' sync limits over real HTTP, Postgres and Redis, through two API instances on one
// store: requests per minute, tokens per minute (charged as an estimate, settled to the real
// count) and calls at once, each refused with 429, Retry-After and an error naming the limit,
// before any inference runs; and a process that dies mid-call gives its place back once its
// lease lapses, while a live one keeps it.
#include "api/sync_limits.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/testing/api_harness.h"
#include "tests/testing/test_db.h"

namespace hr::api {
namespace {

using nlohmann::json;
using testing::ApiHarness;
using testing::HttpResult;

// Answers every call with 10 prompt and 5 answer tokens, counting the calls; while `hold` is set,
// each call waits until it is cleared.
class CountingSync final : public SyncInference {
 public:
  std::atomic<int> calls{0};
  std::atomic<int> running{0};

  void hold(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = on;
    cv_.notify_all();
  }
  Result<SyncAnswer> run(const wire::ChatRequest&, const SyncCall&) override {
    ++calls;
    ++running;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !held_; });
    }
    --running;
    wire::Answer a;
    a.text = "ok";
    a.finish_reason = "stop";
    a.usage = {10, 5, 0};
    return SyncAnswer{a, ""};
  }
  Result<std::unique_ptr<wire::AnswerStream>> start_stream(const wire::ChatRequest&,
                                                           const SyncCall&) override {
    return Status(StatusCode::kInternal, "not streamed here");
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
};

HttpResult call(ApiHarness& h, const std::string& key, int max_tokens = 8) {
  json body = {{"messages", {{{"role", "user"}, {"content", "reverse: abc"}}}},
               {"max_tokens", max_tokens}};
  return h.post("/ai/run/" + h.model(), body.dump(), key);
}

HttpResult openai_call(ApiHarness& h, const std::string& key) {
  json body = {{"model", h.model()},
               {"messages", {{{"role", "user"}, {"content", "reverse: abc"}}}},
               {"max_tokens", 8}};
  return h.post("/v1/chat/completions", body.dump(), key);
}

void set_limits(ApiHarness& h, const std::string& assignments) {
  h.scalar("WITH u AS (UPDATE accounts SET " + assignments +
           " WHERE name = 'alice' RETURNING 1) SELECT count(*) FROM u");
}

class SyncLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    one_ = std::make_unique<ApiHarness>();
    ASSERT_TRUE(one_->ok());
    two_ = std::make_unique<ApiHarness>(one_->database_url(), one_->redis_url());
    ASSERT_TRUE(two_->ok());
    one_->api().set_sync_inference(&sync_);
    two_->api().set_sync_inference(&sync_);
  }
  void TearDown() override {
    sync_.hold(false);
    if (one_) one_->api().set_sync_inference(nullptr);
    if (two_) two_->api().set_sync_inference(nullptr);
  }
  ApiHarness& one() { return *one_; }
  ApiHarness& two() { return *two_; }
  ApiHarness& either(int i) { return i % 2 == 0 ? *one_ : *two_; }

  CountingSync sync_;
  std::unique_ptr<ApiHarness> one_;
  std::unique_ptr<ApiHarness> two_;
};

TEST_F(SyncLimitsTest, RequestsPerMinuteHoldAcrossApiProcesses) {
  set_limits(one(), "sync_requests_per_minute = 3");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(call(either(i), either(i).key_a()).status, 200) << i;
  HttpResult over = call(two(), two().key_a());
  EXPECT_EQ(over.status, 429) << over.body;
  EXPECT_EQ(over.json()["errors"][0]["field"], "sync_requests_per_minute") << over.body;
  ASSERT_EQ(over.headers.count("Retry-After"), 1u);
  const int retry = std::stoi(over.headers["Retry-After"]);
  EXPECT_GE(retry, 15);  // the next of 3 a minute is due ~20 s on
  EXPECT_LE(retry, 21);
  HttpResult openai = openai_call(one(), one().key_a());
  EXPECT_EQ(openai.status, 429) << openai.body;
  EXPECT_EQ(openai.json()["error"]["type"], "rate_limit_error") << openai.body;
  EXPECT_EQ(openai.json()["error"]["param"], "sync_requests_per_minute") << openai.body;
  EXPECT_EQ(sync_.calls.load(), 3);  // refused before any inference
  // Another account is not limited.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(call(either(i), either(i).key_b()).status, 200);
}

// Waits (up to 10 s) until `n` calls are in the inference.
bool wait_running(CountingSync& sync, int n) {
  for (int i = 0; i < 2000 && sync.running.load() < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return sync.running.load() >= n;
}

TEST_F(SyncLimitsTest, TokensPerMinuteChargeTheEstimateThenTheRealCount) {
  // Each call may use 3 + 100 tokens when admitted, and uses 15: settled, ten take 150 of 500
  // (unsettled they would take 1,030).
  set_limits(one(), "sync_tokens_per_minute = 500");
  for (int i = 0; i < 10; ++i) {
    HttpResult r = call(either(i), either(i).key_a(), 100);
    EXPECT_EQ(r.status, 200) << i << " " << r.body;
  }
  // Calls held in progress are charged their estimate until they end: three of 103 fit with the
  // 150, the fourth does not.
  sync_.hold(true);
  std::vector<std::thread> held;
  for (int i = 0; i < 3; ++i) {
    held.emplace_back([&, i] { EXPECT_EQ(call(either(i), either(i).key_a(), 100).status, 200); });
  }
  if (!wait_running(sync_, 3)) {
    sync_.hold(false);
    for (auto& t : held) t.join();
    FAIL() << "the calls did not all start";
  }
  HttpResult over = call(two(), two().key_a(), 100);
  EXPECT_EQ(over.status, 429) << over.body;
  EXPECT_EQ(over.json()["errors"][0]["field"], "sync_tokens_per_minute") << over.body;
  EXPECT_EQ(over.headers.count("Retry-After"), 1u);
  sync_.hold(false);
  for (auto& t : held) t.join();
  EXPECT_EQ(call(one(), one().key_a(), 100).status, 200);  // settled: room again
  // A call that could never fit in a minute is a bad request naming max_tokens.
  set_limits(one(), "sync_tokens_per_minute = 100");
  std::this_thread::sleep_for(std::chrono::milliseconds(5100));  // the limits are read again
  HttpResult big = call(one(), one().key_a(), 120);
  EXPECT_EQ(big.status, 400) << big.body;
  EXPECT_EQ(big.json()["errors"][0]["field"], "max_tokens") << big.body;
}

TEST_F(SyncLimitsTest, CallsAtOnceAreCountedAcrossApiProcesses) {
  set_limits(one(), "max_concurrent_sync = 2");
  sync_.hold(true);
  std::vector<std::thread> held;
  for (int i = 0; i < 2; ++i) {
    held.emplace_back([&, i] { EXPECT_EQ(call(either(i), either(i).key_a()).status, 200); });
  }
  if (!wait_running(sync_, 2)) {
    sync_.hold(false);
    for (auto& t : held) t.join();
    FAIL() << "the calls did not all start";
  }
  for (int i = 0; i < 2; ++i) {
    HttpResult over = call(either(i), either(i).key_a());
    EXPECT_EQ(over.status, 429) << over.body;
    EXPECT_EQ(over.json()["errors"][0]["field"], "max_concurrent_sync") << over.body;
    EXPECT_EQ(over.headers.count("Retry-After"), 1u);
  }
  EXPECT_EQ(sync_.calls.load(), 2);
  sync_.hold(false);
  for (auto& t : held) t.join();
  EXPECT_EQ(call(two(), two().key_a()).status, 200);  // their places were given back
}

// A process that dies mid-call neither releases nor renews its call's place: it lapses after the
// lease. A live process renews its calls' places however long they run.
TEST(SyncLimiterTest, ADeadProcessesCallsLapseALiveOnesStay) {
  const std::string redis = hr::testing::redis_url();
  ASSERT_FALSE(redis.empty());
  const std::string account =
      "acct-" + std::to_string(::getpid()) + "-" +
      std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  auto one_at_a_time = [](const std::string&) -> Result<SyncLimits> {
    SyncLimits l;
    l.concurrent = 1;
    return l;
  };
  SyncLimiterOptions o;
  o.redis_url = redis;
  o.lease_ms = 600;
  auto dying = std::make_unique<SyncLimiter>(o, one_at_a_time);
  auto first = dying->admit(account, 10);
  ASSERT_TRUE(std::holds_alternative<SyncPermit>(first));
  // The process dies: the permit is never released, and no one renews it.
  new SyncPermit(std::move(std::get<SyncPermit>(first)));  // NOLINT: leaked on purpose
  dying.reset();
  SyncLimiter other(o, one_at_a_time);
  auto refused = other.admit(account, 10);
  ASSERT_TRUE(std::holds_alternative<SyncRefusal>(refused));
  EXPECT_EQ(std::get<SyncRefusal>(refused).status.field(), "max_concurrent_sync");
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  auto after = other.admit(account, 10);
  ASSERT_TRUE(std::holds_alternative<SyncPermit>(after)) << "the dead process's place lapsed";
  // `other` lives and holds its call for three leases: still counted.
  std::this_thread::sleep_for(std::chrono::milliseconds(1800));
  SyncLimiter third(o, one_at_a_time);
  EXPECT_TRUE(std::holds_alternative<SyncRefusal>(third.admit(account, 10)));
  std::get<SyncPermit>(after) = SyncPermit();  // ended: released at once
  EXPECT_TRUE(std::holds_alternative<SyncPermit>(third.admit(account, 10)));
}

}  // namespace
}  // namespace hr::api
