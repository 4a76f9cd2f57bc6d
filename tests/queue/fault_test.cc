// Fault tests on a private Postgres and Redis: Redis flushed or restarted empty mid-batch, and
// Postgres restarted under the API. Nothing acknowledged may be lost.
#include <gtest/gtest.h>
#include <pqxx/pqxx>

#include <algorithm>
#include <atomic>
#include <thread>

#include "base/ids.h"
#include "queue/dispatcher.h"
#include "queue/lease.h"
#include "queue/migrate.h"
#include "queue/redis.h"
#include "queue/store.h"
#include "tests/testing/api_harness.h"
#include "tests/testing/stack.h"

namespace hr::queue {
namespace {

using nlohmann::json;

int complete_all(LeaseClient& c, Dispatcher& d, int limit) {
  int done = 0;
  for (int round = 0; round < 200 && done < limit; ++round) {
    (void)d.tick();
    auto got = c.pull(std::min(50, limit - done), 100);
    if (!got.is_ok() || got->empty()) continue;
    std::vector<Completion> cs;
    for (const Lease& l : *got) cs.push_back({l, "{\"response\":\"x\"}", 1, 1, 0});
    auto r = c.complete(cs);
    if (r.is_ok()) done += static_cast<int>(std::count(r->begin(), r->end(), true));
  }
  return done;
}

void run_redis_loss(bool restart) {
  hr::testing::PrivateStack stack;
  ASSERT_TRUE(stack.ok());
  ASSERT_TRUE(migrate(stack.database_url(), bundled_migrations()).is_ok());
  pqxx::connection conn(stack.database_url());
  std::string account = create_api_key(conn, "acct").value().account_id;
  NewBatch b;
  b.account_id = account;
  b.model = "@test/flush";
  for (int i = 0; i < 200; ++i) b.requests.push_back({std::nullopt, "{}"});
  std::string batch = submit_batch(conn, b).value().batch_id;

  auto d = Dispatcher::create(stack.database_url(), stack.redis_url(), {}).value();
  auto c = LeaseClient::create(stack.database_url(), stack.redis_url(),
                               {"@test/flush", "w", 30000, 3}).value();
  EXPECT_EQ(complete_all(*c, *d, 50), 50);
  ASSERT_TRUE(restart ? stack.restart_redis_empty() : stack.flush_redis());
  // The stream and its group are gone; the dispatcher notices and re-sends what is queued.
  EXPECT_EQ(complete_all(*c, *d, 150), 150);
  auto info = get_batch(conn, account, batch).value();
  EXPECT_EQ(info.status, "completed");
  EXPECT_EQ(info.num_completed, 200);
  pqxx::nontransaction tx(conn);
  EXPECT_EQ(tx.exec1("SELECT count(*) FROM requests WHERE status = 'completed'")[0].as<int>(), 200);
}

TEST(FaultTest, RedisFlushedMidBatchStillCompletesEverything) { run_redis_loss(false); }

TEST(FaultTest, RedisRestartedEmptyMidBatchStillCompletesEverything) { run_redis_loss(true); }

TEST(FaultTest, PostgresRestartAnswers503AndLosesNothingAcknowledged) {
  hr::testing::PrivateStack stack;
  ASSERT_TRUE(stack.ok());
  hr::testing::ApiHarness h(stack.database_url(), stack.redis_url());
  ASSERT_TRUE(h.ok());
  json req = {{"prompt", "reverse: x"}};
  std::vector<std::string> acked;
  for (int i = 0; i < 5; ++i) acked.push_back(h.submit({req, req}, h.key_a()));
  ASSERT_TRUE(stack.stop_postgres());
  std::string target = "/ai/run/" + h.model() + "?queueRequest=true";
  std::string body = json{{"requests", {req}}}.dump();
  int unavailable = 0;
  for (int i = 0; i < 3; ++i) {
    auto r = h.post(target, body, h.key_a());
    EXPECT_EQ(r.status, 503) << r.body;
    if (r.status == 503) {
      ++unavailable;
      EXPECT_EQ(r.headers["Retry-After"], "1");
      EXPECT_EQ(r.json()["success"], false);
    } else if (r.status == 200) {
      acked.push_back(r.json()["result"]["request_id"]);
    }
  }
  EXPECT_EQ(unavailable, 3);
  EXPECT_EQ(h.get("/readyz", "").status, 503);
  ASSERT_TRUE(stack.start_postgres());
  // The API reconnects by itself.
  bool recovered = false;
  for (int i = 0; i < 50 && !recovered; ++i) {
    auto r = h.post(target, body, h.key_a());
    if (r.status == 200) {
      recovered = true;
      acked.push_back(r.json()["result"]["request_id"]);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  EXPECT_TRUE(recovered);
  for (const std::string& id : acked) {
    auto g = h.get("/v1/async/" + id, h.key_a());
    EXPECT_EQ(g.status, 200) << id << " " << g.body;
  }
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches"), static_cast<int64_t>(acked.size()));
}

// Readiness probes, however many handler threads answer them, share one Redis connection, and
// after Redis restarts they report it ready at once (the stale connection is replaced).
TEST(FaultTest, ReadinessProbesShareOneRedisConnectionAndSeeItComeBack) {
  hr::testing::PrivateStack stack;
  ASSERT_TRUE(stack.ok());
  hr::testing::ApiHarness h(stack.database_url(), stack.redis_url());
  ASSERT_TRUE(h.ok());
  auto probe_all = [&](int expected) {
    std::vector<std::thread> probes;
    std::atomic<int> as_expected{0};
    for (int t = 0; t < 8; ++t) {
      probes.emplace_back([&] {
        for (int i = 0; i < 5; ++i) as_expected += h.get("/readyz", "").status == expected ? 1 : 0;
      });
    }
    for (auto& t : probes) t.join();
    return as_expected.load();
  };
  EXPECT_EQ(probe_all(200), 40);
  auto redis = RedisClient::connect(stack.redis_url(), 1000);
  ASSERT_TRUE(redis.is_ok());
  auto clients = (*redis)->command({"CLIENT", "LIST"});
  ASSERT_TRUE(clients.is_ok()) << clients.status().to_string();
  const std::string list = clients->str;
  EXPECT_EQ(std::count(list.begin(), list.end(), '\n'), 2) << list;  // the API's and this one
  ASSERT_TRUE(stack.restart_redis_empty());
  EXPECT_EQ(probe_all(200), 40);
}

}  // namespace
}  // namespace hr::queue
