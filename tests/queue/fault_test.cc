// Fault tests on a private Postgres and Redis: Redis flushed, restarted empty or evicting the
// stream mid-batch, Redis paused under the relay, and Postgres restarted under the API. Nothing
// acknowledged may be lost.
#include <gtest/gtest.h>
#include <pqxx/pqxx>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "base/ids.h"
#include "queue/dispatcher.h"
#include "queue/lease.h"
#include "queue/migrate.h"
#include "queue/redis.h"
#include "queue/store.h"
#include "queue/stream.h"
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
    if (!got.is_ok() || got->empty()) {
      // Before its group exists a stream answers at once: wait as an idle worker would.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    std::vector<Completion> cs;
    for (const Lease& l : *got) cs.push_back({l, "{\"response\":\"x\"}", 1, 1, 0});
    auto r = c.complete(cs);
    if (r.is_ok()) done += static_cast<int>(std::count(r->begin(), r->end(), true));
  }
  return done;
}

// A private stack with a migrated database, an account and a batch of `n` requests for `model`.
struct StackWithBatch {
  hr::testing::PrivateStack stack;
  std::unique_ptr<pqxx::connection> conn;
  std::string account;
  std::string model = "@test/stack";
  std::string submit(int n) {
    NewBatch b;
    b.account_id = account;
    b.model = model;
    for (int i = 0; i < n; ++i) b.requests.push_back({std::nullopt, "{}", 0, std::nullopt});
    return submit_batch(*conn, b).value().batch_id;
  }
  int64_t scalar(const std::string& sql) {
    pqxx::nontransaction tx(*conn);
    return tx.exec1(sql)[0].as<int64_t>();
  }
  bool ok() {
    if (!stack.ok() || !migrate(stack.database_url(), bundled_migrations()).is_ok()) return false;
    conn = std::make_unique<pqxx::connection>(stack.database_url());
    account = create_api_key(*conn, "acct").value().account_id;
    return true;
  }
};

enum class RedisLoss { kFlush, kRestart, kEvictStream };

// Makes Redis evict the model's stream under memory pressure (only keys with a TTL may go, and the
// stream is given one), leaving every other key, hr:epoch included. Then a push (a worker putting
// a request back, say) creates the stream anew, without its group, before a dispatcher looks.
void evict_stream(const std::string& redis_url, const std::string& model) {
  auto r = RedisClient::connect(redis_url, 5000);
  ASSERT_TRUE(r.is_ok());
  RedisClient& redis = **r;
  const std::string key = stream_key(model);
  ASSERT_EQ(redis.command({"EXISTS", key})->integer, 1);
  ASSERT_TRUE(redis.command({"EXPIRE", key, "100000"}).is_ok());
  ASSERT_TRUE(redis.command({"CONFIG", "SET", "maxmemory-policy", "volatile-lru"}).is_ok());
  std::string memory = redis.command({"INFO", "memory"})->str;
  size_t p = memory.find("used_memory:") + 12;
  int64_t used = std::stoll(memory.substr(p, memory.find('\r', p) - p));
  ASSERT_TRUE(
      redis.command({"CONFIG", "SET", "maxmemory", std::to_string(used + (2 << 20))}).is_ok());
  const std::string filler(64 << 10, 'x');
  for (int i = 0; i < 2000 && redis.command({"EXISTS", key})->integer == 1; ++i) {
    (void)redis.command({"SET", "filler:" + std::to_string(i), filler, "EX", "100000"});
  }
  EXPECT_EQ(redis.command({"EXISTS", key})->integer, 0) << "the stream was not evicted";
  EXPECT_EQ(redis.command({"EXISTS", "hr:epoch"})->integer, 1);
  ASSERT_TRUE(redis.command({"CONFIG", "SET", "maxmemory", "0"}).is_ok());
  ASSERT_TRUE(
      redis.command({"XADD", key, "*", "b", "00000000-0000-4000-8000-000000000000", "i", "0"})
          .is_ok());
}

void run_redis_loss(RedisLoss loss) {
  StackWithBatch s;
  ASSERT_TRUE(s.ok());
  hr::testing::PrivateStack& stack = s.stack;
  std::string batch = s.submit(200);
  auto d = Dispatcher::create(stack.database_url(), stack.redis_url(), {}).value();
  auto c = LeaseClient::create(stack.database_url(), stack.redis_url(), {s.model, "w", 30000, 3})
               .value();
  EXPECT_EQ(complete_all(*c, *d, 50), 50);
  switch (loss) {
    case RedisLoss::kFlush:
      ASSERT_TRUE(stack.flush_redis());
      break;
    case RedisLoss::kRestart:
      ASSERT_TRUE(stack.restart_redis_empty());
      break;
    case RedisLoss::kEvictStream: {
      evict_stream(stack.redis_url(), s.model);
      // Workers do not create the group again (that would hide the loss): nothing to pull until
      // a dispatcher has looked.
      auto early = c->pull(10, 0);
      ASSERT_TRUE(early.is_ok()) << early.status().to_string();
      EXPECT_TRUE(early->empty());
      auto redis = RedisClient::connect(stack.redis_url(), 5000).value();
      EXPECT_FALSE(group_exists(*redis, s.model).value());
      break;
    }
  }
  // The stream and its group are gone; the dispatcher notices and re-sends what is queued.
  EXPECT_EQ(complete_all(*c, *d, 150), 150);
  auto info = get_batch(*s.conn, s.account, batch).value();
  EXPECT_EQ(info.status, "completed");
  EXPECT_EQ(info.num_completed, 200);
  EXPECT_EQ(s.scalar("SELECT count(*) FROM requests WHERE status = 'completed'"), 200);
}

TEST(FaultTest, RedisFlushedMidBatchStillCompletesEverything) { run_redis_loss(RedisLoss::kFlush); }

TEST(FaultTest, RedisRestartedEmptyMidBatchStillCompletesEverything) {
  run_redis_loss(RedisLoss::kRestart);
}

// A Redis that evicts keys under maxmemory may evict a stream while its epoch marker stays.
TEST(FaultTest, AStreamEvictedMidBatchStillCompletesEverything) {
  run_redis_loss(RedisLoss::kEvictStream);
}

// Runs d.relay_once() while Redis takes no writes for `pause_ms`; `meanwhile` runs `after_ms` in,
// while the relay waits on Redis.
Result<int> relay_while_redis_paused(Dispatcher& d, const std::string& redis_url, int pause_ms,
                                     int after_ms, const std::function<void()>& meanwhile) {
  auto redis = RedisClient::connect(redis_url, 5000);
  if (!redis.is_ok()) return redis.status();
  auto paused = (*redis)->command({"CLIENT", "PAUSE", std::to_string(pause_ms), "WRITE"});
  if (!paused.is_ok()) return paused.status();
  Result<int> relayed = 0;
  std::thread relay([&] { relayed = d.relay_once(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(after_ms));
  meanwhile();
  relay.join();
  return relayed;
}

// While the relay waits on Redis, it holds no lock on the batch's row, so workers' result writes
// to it go on; once Redis answers, the relay finishes and moves its cursor.
TEST(FaultTest, TheRelayLocksNoBatchRowWhileItWaitsOnRedis) {
  StackWithBatch s;
  ASSERT_TRUE(s.ok());
  std::string batch = s.submit(20);
  auto d = Dispatcher::create(s.stack.database_url(), s.stack.redis_url(), {}).value();
  ASSERT_TRUE(d->tick().is_ok());  // relays the 20 (and records the Redis instance)
  std::string second = s.submit(20);
  auto relayed = relay_while_redis_paused(*d, s.stack.redis_url(), 1500, 300, [&] {
    // A worker's result write to each batch, while the relay is inside its pushes.
    for (const std::string& id : {batch, second}) {
      try {
        pqxx::connection other(s.stack.database_url());
        pqxx::work tx(other);
        tx.exec("SET LOCAL lock_timeout = '300ms'");
        tx.exec_params("UPDATE batches SET num_completed = num_completed WHERE id = $1::uuid", id);
        tx.commit();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "batch " << id << ": " << e.what();
      }
    }
  });
  ASSERT_TRUE(relayed.is_ok()) << relayed.status().to_string();
  EXPECT_EQ(*relayed, 20);
  EXPECT_EQ(s.scalar("SELECT sum(num_dispatched) FROM batches"), 40);
  auto c = LeaseClient::create(s.stack.database_url(), s.stack.redis_url(), {s.model, "w", 30000})
               .value();
  auto leases = c->pull(100, 1000);
  ASSERT_TRUE(leases.is_ok());
  EXPECT_EQ(leases->size(), 40u);
}

// A resync (Redis lost: every cursor rewound) that commits while the relay is pushing keeps the
// relay from moving the cursor past requests that may have gone with the lost Redis.
TEST(FaultTest, ARelayThatRacedAResyncLeavesTheCursorRewound) {
  StackWithBatch s;
  ASSERT_TRUE(s.ok());
  s.submit(20);
  auto d = Dispatcher::create(s.stack.database_url(), s.stack.redis_url(), {}).value();
  ASSERT_TRUE(d->resync_if_redis_lost().is_ok());  // records the Redis instance
  ASSERT_TRUE(d->ensure_stream(s.model).is_ok());  // so that the relay waits in its pushes
  auto relayed = relay_while_redis_paused(*d, s.stack.redis_url(), 800, 200, [&] {
    // What another dispatcher's resync commits on finding Redis replaced.
    pqxx::connection other(s.stack.database_url());
    pqxx::work tx(other);
    tx.exec("UPDATE redis_state SET value = 'another-instance' WHERE key = 'observed'");
    tx.exec("UPDATE batches SET num_dispatched = 0 WHERE finished_at IS NULL");
    tx.commit();
  });
  ASSERT_TRUE(relayed.is_ok()) << relayed.status().to_string();
  EXPECT_EQ(*relayed, 0);
  EXPECT_EQ(s.scalar("SELECT num_dispatched FROM batches"), 0);
  // The next pass pushes the batch again, and this time the cursor moves.
  auto again = d->relay_once();
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(*again, 20);
  EXPECT_EQ(s.scalar("SELECT num_dispatched FROM batches"), 20);
}

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
  // The API's probe connection, its operator-view sampler's, and this one: 40 probes opened none.
  EXPECT_EQ(std::count(list.begin(), list.end(), '\n'), 3) << list;
  ASSERT_TRUE(stack.restart_redis_empty());
  EXPECT_EQ(probe_all(200), 40);
}

// Postgres frozen under the API (SIGSTOP: it accepts connections and answers nothing): /readyz
// and an authenticated poll answer 503 within 2 s instead of hanging, and 200 again once it is
// back.
TEST(FaultTest, FrozenPostgresAnswers503WithinTwoSeconds) {
  hr::testing::PrivateStack stack;
  ASSERT_TRUE(stack.ok());
  hr::testing::ApiHarness h(stack.database_url(), stack.redis_url());
  ASSERT_TRUE(h.ok());
  const std::string id = h.submit(json::array({{{"prompt", "x"}}}), h.key_a());
  ASSERT_FALSE(id.empty());
  const std::string poll = "/v1/async/" + id;
  ASSERT_EQ(h.get(poll, h.key_a()).status, 200);
  ASSERT_EQ(h.get("/readyz", "").status, 200);
  ASSERT_TRUE(stack.pause_postgres());
  struct Timed {
    int status;
    double secs;
  };
  auto timed = [&](const std::string& target, const std::string& key) {
    const auto t0 = std::chrono::steady_clock::now();
    const int status = h.get(target, key).status;
    return Timed{status,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  };
  const Timed p = timed(poll, h.key_a());
  const Timed r = timed("/readyz", "");
  ASSERT_TRUE(stack.resume_postgres());
  EXPECT_EQ(p.status, 503);
  EXPECT_LT(p.secs, 2.0);
  EXPECT_EQ(r.status, 503);
  EXPECT_LT(r.secs, 2.0);
  int back = 0;
  for (int i = 0; i < 50 && back != 200; ++i) {
    back = h.get(poll, h.key_a()).status;
    if (back != 200) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(back, 200);
  EXPECT_EQ(h.get("/readyz", "").status, 200);
}

}  // namespace
}  // namespace hr::queue
