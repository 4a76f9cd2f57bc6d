// Leases, relay and janitor against real Postgres and Redis, driven by a test consumer built on
// the queue library.
#include "queue/lease.h"

#include <gtest/gtest.h>
#include <pqxx/pqxx>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "base/ids.h"
#include "queue/accounts.h"
#include "queue/dispatcher.h"
#include "queue/migrate.h"
#include "queue/open_work.h"
#include "queue/store.h"
#include "queue/stream.h"
#include "tests/testing/test_db.h"

namespace hr::queue {
namespace {

class LeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    redis_ = hr::testing::redis_url();
    ASSERT_TRUE(db_.ok());
    ASSERT_FALSE(redis_.empty());
    ASSERT_TRUE(migrate(db_.url(), bundled_migrations()).is_ok());
    conn_ = std::make_unique<pqxx::connection>(db_.url());
    auto key = create_api_key(*conn_, "acct");
    ASSERT_TRUE(key.is_ok());
    account_ = key->account_id;
    model_ = "@test/q-" + random_hex(4);
  }

  std::string submit(int n, std::optional<int64_t> deadline_ms = std::nullopt) {
    NewBatch b;
    b.account_id = account_;
    b.model = model_;
    b.deadline_unix_ms = deadline_ms;
    for (int i = 0; i < n; ++i) b.requests.push_back({std::nullopt, "{\"prompt\":\"p\"}"});
    auto r = submit_batch(*conn_, b);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? r->batch_id : "";
  }

  std::unique_ptr<Dispatcher> dispatcher() {
    auto d = Dispatcher::create(db_.url(), redis_, {});
    EXPECT_TRUE(d.is_ok());
    return std::move(d).value();
  }

  std::unique_ptr<LeaseClient> consumer(const std::string& owner, int lease_ms = 30000,
                                        int max_attempts = 3) {
    auto c = LeaseClient::create(db_.url(), redis_, {model_, owner, lease_ms, max_attempts});
    EXPECT_TRUE(c.is_ok());
    return std::move(c).value();
  }

  int64_t scalar(const std::string& sql) {
    pqxx::nontransaction tx(*conn_);
    return tx.exec1(sql)[0].as<int64_t>();
  }

  std::string status_of(const std::string& batch) {
    return get_batch(*conn_, account_, batch).value().status;
  }

  static std::vector<Completion> completions(const std::vector<Lease>& leases,
                                             const std::string& tag) {
    std::vector<Completion> out;
    for (const Lease& l : leases) out.push_back({l, "{\"response\":\"" + tag + "\"}", 5, 2, 0});
    return out;
  }

  hr::testing::TestDatabase db_;
  std::string redis_;
  std::unique_ptr<pqxx::connection> conn_;
  std::string account_;
  std::string model_;
};

TEST_F(LeaseTest, RelayPullCompleteFinishesTheBatchOnce) {
  std::string batch = submit(50);
  auto d = dispatcher();
  auto tick = d->tick();
  ASSERT_TRUE(tick.is_ok()) << tick.status().to_string();
  EXPECT_EQ(tick->relayed, 50);
  EXPECT_EQ(scalar("SELECT num_dispatched FROM batches"), 50);
  auto c = consumer("w1");
  auto leases = c->pull(100, 1000);
  ASSERT_TRUE(leases.is_ok()) << leases.status().to_string();
  ASSERT_EQ(leases->size(), 50u);
  EXPECT_EQ(status_of(batch), "running");
  EXPECT_EQ(scalar("SELECT count(*) FROM requests WHERE status = 'running' AND attempt = 1 "
                   "AND lease_owner = 'w1'"),
            50);
  auto accepted = c->complete(completions(*leases, "ok"));
  ASSERT_TRUE(accepted.is_ok());
  EXPECT_EQ(std::count(accepted->begin(), accepted->end(), true), 50);
  auto info = get_batch(*conn_, account_, batch).value();
  EXPECT_EQ(info.status, "completed");
  EXPECT_EQ(info.num_completed, 50);
  EXPECT_EQ(info.prompt_tokens, 250);
  EXPECT_EQ(scalar("SELECT count(*) FROM outbox WHERE event_type = 'batch.queued'"), 1);
  EXPECT_EQ(scalar("SELECT count(*) FROM outbox WHERE event_type = 'batch.completed'"), 1);
  // Nothing left behind in the stream.
  auto again = c->pull(100, 100);
  ASSERT_TRUE(again.is_ok());
  EXPECT_TRUE(again->empty());
}

// Requests put back in the queue whose push to Redis fails after the commit (here the stream's key
// holds a string, and then the stream is gone, as after a Redis loss that resync cannot see) are
// pushed by the janitor once Redis works again: by a worker's retryable failure and release, and
// by the janitor's own requeue of an expired lease. A retried call acks its entry without loss.
TEST_F(LeaseTest, RequeuesWhosePushFailedArePushedByTheJanitor) {
  submit(3);
  auto d = dispatcher();
  ASSERT_TRUE(d->tick().is_ok());
  auto c = consumer("w1");
  auto expiring = consumer("w2", /*lease_ms=*/200);
  std::vector<Lease> leases = c->pull(2, 1000).value();
  ASSERT_EQ(leases.size(), 2u);
  ASSERT_EQ(expiring->pull(1, 1000).value().size(), 1u);
  auto redis = RedisClient::connect(redis_).value();
  const std::string key = stream_key(model_);
  ASSERT_TRUE(redis->command({"DEL", key}).is_ok());
  ASSERT_TRUE(redis->command({"SET", key, "not a stream"}).is_ok());
  EXPECT_FALSE(c->fail({{leases[0], "inference_error", "boom", true}}).is_ok());
  EXPECT_FALSE(
      c->fail({{leases[0], "inference_error", "boom", true}}).is_ok());  // the worker retries
  EXPECT_FALSE(c->release({leases[1]}).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_FALSE(d->requeue_expired_leases().is_ok());
  EXPECT_EQ(scalar("SELECT count(*) FROM requests WHERE status = 'queued' AND push_pending"), 3);
  ASSERT_TRUE(redis->command({"DEL", key}).is_ok());
  auto t = d->tick();
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->pushed, 3);
  EXPECT_EQ(scalar("SELECT count(*) FROM requests WHERE push_pending"), 0);
  std::vector<Lease> again = consumer("w3")->pull(10, 1000).value();
  ASSERT_EQ(again.size(), 3u);
  for (const Lease& l : again) EXPECT_EQ(l.attempt, 2);
  EXPECT_EQ(
      scalar("SELECT num_failures FROM requests WHERE idx = " + std::to_string(leases[0].ref.idx)),
      1);
  EXPECT_EQ(d->tick()->pushed, 0);
}

// A cancel leaves running requests to finish; one of them that goes back to the queue instead (its
// worker stopped, its lease expired) is ended as cancelled by the janitor, so the batch ends.
TEST_F(LeaseTest, ACancelledBatchsRequestPutBackInTheQueueEndsCancelled) {
  std::string batch = submit(2);
  auto d = dispatcher();
  ASSERT_TRUE(d->tick().is_ok());
  auto c = consumer("w1");
  std::vector<Lease> leases = c->pull(1, 1000).value();
  ASSERT_EQ(leases.size(), 1u);
  auto cancelled = cancel_batch(*conn_, account_, batch);
  ASSERT_TRUE(cancelled.is_ok());
  EXPECT_EQ(cancelled->num_cancelled_now, 1);
  EXPECT_EQ(status_of(batch), "running");
  ASSERT_TRUE(c->release(leases).is_ok());
  auto t = d->tick();
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->cancelled, 1);
  BatchInfo info = get_batch(*conn_, account_, batch).value();
  EXPECT_EQ(info.status, "cancelled");
  EXPECT_EQ(info.num_cancelled, 2);
  EXPECT_EQ(scalar("SELECT count(*) FROM outbox WHERE event_type = 'batch.cancelled'"), 1);
}

// A request that the janitor ends failed (its lease expired once too often) gets its
// request.completed event, as one that a worker fails does.
TEST_F(LeaseTest, RequestsTheJanitorFailsGetTheirRequestEvent) {
  NewBatch b;
  b.account_id = account_;
  b.model = model_;
  b.webhook_url = "https://hooks.example.com/h";
  b.webhook_events = std::vector<std::string>{"request.completed"};
  b.requests.push_back({std::string("c-1"), "{\"prompt\":\"p\"}"});
  ASSERT_TRUE(submit_batch(*conn_, b).is_ok());
  DispatcherOptions o;
  o.max_attempts = 1;
  auto d = Dispatcher::create(db_.url(), redis_, o).value();
  ASSERT_TRUE(d->tick().is_ok());
  auto c = consumer("w1", /*lease_ms=*/200);
  ASSERT_EQ(c->pull(1, 1000).value().size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto ended = d->requeue_expired_leases();
  ASSERT_TRUE(ended.is_ok()) << ended.status().to_string();
  EXPECT_EQ(ended->second, 1);
  EXPECT_EQ(
      scalar("SELECT count(*) FROM outbox WHERE event_type = 'request.completed' "
             "AND payload->'data'->>'status' = 'failed' AND payload->'data'->>'custom_id' = 'c-1'"),
      1);
}

TEST_F(LeaseTest, StaleConsumersLateCompletionIsRefused) {
  std::string batch = submit(1);
  auto d = dispatcher();
  ASSERT_TRUE(d->tick().is_ok());
  auto slow = consumer("slow", /*lease_ms=*/200);
  auto a = slow->pull(1, 1000);
  ASSERT_TRUE(a.is_ok());
  ASSERT_EQ(a->size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto requeued = d->requeue_expired_leases();
  ASSERT_TRUE(requeued.is_ok());
  EXPECT_EQ(requeued->first, 1);
  auto fast = consumer("fast");
  auto b = fast->pull(1, 1000);
  ASSERT_TRUE(b.is_ok());
  ASSERT_EQ(b->size(), 1u);
  EXPECT_EQ((*b)[0].attempt, 2);
  ASSERT_TRUE(fast->complete(completions(*b, "fast")).value()[0]);
  // The stale worker's write is fenced out, and so is its renewal.
  EXPECT_FALSE(slow->complete(completions(*a, "slow")).value()[0]);
  EXPECT_EQ(slow->renew(*a).value().size(), 1u);
  EXPECT_EQ(scalar("SELECT count(*) FROM requests WHERE result LIKE '%fast%'"), 1);
  EXPECT_EQ(get_batch(*conn_, account_, batch).value().num_completed, 1);
}

TEST_F(LeaseTest, DeadConsumersLeasesAreRequeuedAndCompletedOnce) {
  std::string batch = submit(10);
  auto d = dispatcher();
  ASSERT_TRUE(d->tick().is_ok());
  {
    auto dying = consumer("dying", /*lease_ms=*/300);
    auto got = dying->pull(10, 1000);
    ASSERT_TRUE(got.is_ok());
    ASSERT_EQ(got->size(), 10u);
  }  // dies holding every lease
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto tick = d->tick();
  ASSERT_TRUE(tick.is_ok());
  EXPECT_EQ(tick->requeued, 10);
  auto survivor = consumer("survivor");
  auto got = survivor->pull(20, 1000);
  ASSERT_TRUE(got.is_ok());
  ASSERT_EQ(got->size(), 10u);
  auto accepted = survivor->complete(completions(*got, "ok")).value();
  EXPECT_EQ(std::count(accepted.begin(), accepted.end(), true), 10);
  EXPECT_EQ(status_of(batch), "completed");
  EXPECT_EQ(scalar("SELECT count(*) FROM requests WHERE attempt = 2 AND num_failures = 1"), 10);
}

TEST_F(LeaseTest, RenewKeepsLeasesAlive) {
  submit(2);
  auto d = dispatcher();
  ASSERT_TRUE(d->tick().is_ok());
  auto c = consumer("w", /*lease_ms=*/300);
  auto got = c->pull(2, 1000).value();
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    auto lost = c->renew(got);
    ASSERT_TRUE(lost.is_ok());
    EXPECT_TRUE(lost->empty());
    EXPECT_EQ(d->requeue_expired_leases().value().first, 0);
  }
  EXPECT_TRUE(c->complete(completions(got, "ok")).value()[1]);
}

TEST_F(LeaseTest, FailuresRetryThenEndFailed) {
  std::string batch = submit(2);
  auto d = dispatcher();
  ASSERT_TRUE(d->tick().is_ok());
  auto c = consumer("w", 30000, /*max_attempts=*/2);
  auto got = c->pull(2, 1000).value();
  ASSERT_EQ(got.size(), 2u);
  // One succeeds; the other fails retryably, comes back, and fails again for good.
  ASSERT_TRUE(c->complete(completions({got[0]}, "ok")).value()[0]);
  ASSERT_TRUE(c->fail({{got[1], "oom", "out of memory", true}}).value()[0]);
  EXPECT_EQ(status_of(batch), "running");
  auto again = c->pull(2, 1000).value();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].num_failures, 1);
  ASSERT_TRUE(c->fail({{again[0], "oom", "out of memory again", true}}).value()[0]);
  auto info = get_batch(*conn_, account_, batch).value();
  EXPECT_EQ(info.status, "completed_with_errors");
  EXPECT_EQ(info.num_failed, 1);
  EXPECT_EQ(scalar("SELECT count(*) FROM requests WHERE error LIKE '%out of memory again%'"), 1);
}

TEST_F(LeaseTest, ReleasedWorkGoesBackWithoutCountingAFailure) {
  submit(3);
  auto d = dispatcher();
  ASSERT_TRUE(d->tick().is_ok());
  auto c = consumer("w");
  auto got = c->pull(3, 1000).value();
  ASSERT_EQ(got.size(), 3u);
  ASSERT_TRUE(c->release(got).is_ok());
  EXPECT_EQ(scalar("SELECT count(*) FROM requests WHERE status = 'queued' AND num_failures = 0"),
            3);
  auto again = c->pull(3, 1000).value();
  EXPECT_EQ(again.size(), 3u);
}

TEST_F(LeaseTest, DeadlinePassedExpiresUnstartedRequests) {
  int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  std::string batch = submit(4, now_ms + 800);
  auto d = dispatcher();
  ASSERT_TRUE(d->tick().is_ok());
  auto c = consumer("w");
  auto got = c->pull(1, 1000).value();  // one starts in time
  ASSERT_EQ(got.size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_TRUE(c->pull(3, 200).value().empty());  // the rest are past the deadline
  auto tick = d->tick();
  ASSERT_TRUE(tick.is_ok());
  EXPECT_EQ(tick->expired, 3);
  EXPECT_EQ(status_of(batch), "running");  // the started one may still finish
  ASSERT_TRUE(c->complete(completions(got, "ok")).value()[0]);
  auto info = get_batch(*conn_, account_, batch).value();
  EXPECT_EQ(info.status, "expired");
  EXPECT_EQ(info.num_completed, 1);
  EXPECT_EQ(info.num_expired, 3);
  EXPECT_EQ(scalar("SELECT count(*) FROM outbox WHERE event_type = 'batch.expired'"), 1);
}

// One dispatcher at a time relays a model (its relay lock held, here by another connection): the
// others pass it over, and relay it once the lock is free.
TEST_F(LeaseTest, OneDispatcherAtATimeRelaysAModel) {
  submit(5);
  auto d = dispatcher();
  // The stream is there before the relay (a rewind would wait for the lock held below).
  ASSERT_TRUE(d->ensure_stream(model_).is_ok());
  pqxx::connection other(db_.url());
  pqxx::nontransaction locker(other);
  locker.exec_params("SELECT pg_advisory_lock($1, hashtext($2))", 0x4853, model_);
  auto relayed = d->relay_once();
  ASSERT_TRUE(relayed.is_ok()) << relayed.status().to_string();
  EXPECT_EQ(*relayed, 0);
  EXPECT_EQ(scalar("SELECT num_dispatched FROM batches"), 0);
  locker.exec_params("SELECT pg_advisory_unlock($1, hashtext($2))", 0x4853, model_);
  relayed = d->relay_once();
  ASSERT_TRUE(relayed.is_ok()) << relayed.status().to_string();
  EXPECT_EQ(*relayed, 5);
}

// The stream holds a short ready-queue; the backlog waits in Postgres, and what enters the queue
// is shared among accounts by the work they have in flight (waiting or leased) per weight.
class FairRelayTest : public LeaseTest {
 protected:
  std::unique_ptr<Dispatcher> windowed(int64_t entries) {
    DispatcherOptions o;
    o.window = {entries, entries, 250};
    o.newcomer_check_ms = 0;  // every pass looks
    o.catch_up_below = 0;     // the shared stream only (the catch-up one: cache_dispatch_test)
    auto d = Dispatcher::create(db_.url(), redis_, o);
    EXPECT_TRUE(d.is_ok());
    return std::move(d).value();
  }

  std::string account(const std::string& name, double weight) {
    auto key = create_api_key(*conn_, name);
    EXPECT_TRUE(key.is_ok());
    EXPECT_TRUE(set_account_share(*conn_, name, weight, std::nullopt).is_ok());
    return key->account_id;
  }

  std::string submit_as(const std::string& account, int n, std::optional<int> priority = {}) {
    NewBatch b;
    b.account_id = account;
    b.model = model_;
    b.priority = priority;
    for (int i = 0; i < n; ++i) b.requests.push_back({std::nullopt, "{\"prompt\":\"p\"}"});
    auto r = submit_batch(*conn_, b);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? r->batch_id : "";
  }

  // The stream's entries per batch, in stream order.
  std::vector<std::string> stream_batches() {
    auto redis = RedisClient::connect(redis_).value();
    auto r = redis->command({"XRANGE", stream_key(model_), "-", "+"}).value();
    std::vector<std::string> out;
    for (const auto& e : r.elements) out.push_back(e.elements[1].elements[1].str);
    return out;
  }
};

TEST_F(FairRelayTest, ASmallBatchOvertakesABigOnesBacklog) {
  const std::string a = account_;
  const std::string b = account("tenant-b", 1);
  const std::string big = submit_as(a, 5000);
  auto d = windowed(100);
  ASSERT_TRUE(d->tick().is_ok());
  EXPECT_EQ(scalar("SELECT num_dispatched FROM batches WHERE id = '" + big + "'"), 100);
  EXPECT_TRUE(d->relay_waiting());
  // Workers take the 100 and run them; then B submits.
  auto c = consumer("w1");
  auto leased = c->pull(100, 1000);
  ASSERT_TRUE(leased.is_ok());
  ASSERT_EQ(leased->size(), 100u);
  const std::string small = submit_as(b, 50);
  auto relayed = d->relay_once();
  ASSERT_TRUE(relayed.is_ok()) << relayed.status().to_string();
  EXPECT_EQ(*relayed, 100);
  // B had nothing in flight against A's 100: all of B's 50 are in, and the next to be pulled.
  auto next = c->pull(50, 1000);
  ASSERT_TRUE(next.is_ok());
  ASSERT_EQ(next->size(), 50u);
  int of_small = 0;
  for (const Lease& l : *next) of_small += l.ref.batch_id == small;
  EXPECT_GE(of_small, 40);  // interleaved with A's, ahead of A's backlog
  EXPECT_EQ(scalar("SELECT num_dispatched FROM batches WHERE id = '" + small + "'"), 50);
  EXPECT_EQ(scalar("SELECT num_dispatched FROM batches WHERE id = '" + big + "'"), 150);
}

TEST_F(FairRelayTest, AWaitingBacklogMakesWayForANewcomer) {
  const std::string big = submit_as(account_, 5000);
  auto d = windowed(100);
  ASSERT_TRUE(d->relay_once().is_ok());
  ASSERT_EQ(stream_batches().size(), 100u);  // all A's, waiting: no worker took any
  const std::string small = submit_as(account("tenant-b", 1), 50);
  ASSERT_TRUE(d->relay_once().is_ok());
  // A's waiting entries were taken back and the window shared again, interleaved: B's come from
  // the front, not after A's 100.
  std::vector<std::string> order = stream_batches();
  ASSERT_EQ(order.size(), 100u);
  int small_in_front = 0;
  for (int i = 0; i < 20; ++i) small_in_front += order[i] == small;
  EXPECT_GE(small_in_front, 8);
  EXPECT_EQ(std::count(order.begin(), order.end(), small), 50);
  EXPECT_EQ(scalar("SELECT num_dispatched FROM batches WHERE id = '" + big + "'"), 50);
  // Nothing lost or doubled: every request is taken exactly once.
  auto c = consumer("w1");
  std::set<std::pair<std::string, int>> seen;
  auto t0 = std::chrono::steady_clock::now();
  while (seen.size() < 5050 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    ASSERT_TRUE(d->relay_once().is_ok());
    auto got = c->pull(500, 50);
    ASSERT_TRUE(got.is_ok());
    for (const Lease& l : *got) EXPECT_TRUE(seen.insert({l.ref.batch_id, l.ref.idx}).second);
    ASSERT_TRUE(c->complete(completions(*got, "ok")).is_ok());
  }
  EXPECT_EQ(seen.size(), 5050u);
  EXPECT_EQ(status_of(big), "completed");
}

TEST_F(FairRelayTest, WeightsShareTheQueueInProportion) {
  const std::string a = account("tenant-a3", 3);
  const std::string b = account("tenant-b1", 1);
  const std::string heavy = submit_as(a, 5000);
  const std::string light = submit_as(b, 5000);
  auto d = windowed(400);
  ASSERT_TRUE(d->relay_once().is_ok());
  std::map<std::string, int> seen;
  for (const std::string& batch : stream_batches()) ++seen[batch];
  EXPECT_NEAR(seen[heavy], 300, 10);
  EXPECT_NEAR(seen[light], 100, 10);
  EXPECT_EQ(seen[heavy] + seen[light], 400);
}

// The relay learns the model's throughput while entries wait for the workers (they take as fast
// as they can) and publishes it for the API's forecasts (queue/open_work.h).
TEST_F(FairRelayTest, TheRelayPublishesTheThroughputWorkersTakeAtWhileWorkWaits) {
  submit_as(account_, 20000);  // more than is taken: entries wait throughout
  auto d = windowed(100);
  auto redis = RedisClient::connect(redis_).value();
  EXPECT_FALSE(read_model_rate(*redis, model_).value());
  auto c = consumer("w1");
  int taken = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(2500)) {
    ASSERT_TRUE(d->relay_once().is_ok());
    auto got = c->pull(40, 50);  // fewer than the window: some always wait
    ASSERT_TRUE(got.is_ok());
    taken += static_cast<int>(got->size());
    ASSERT_TRUE(c->complete(completions(*got, "ok")).is_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::optional<double> rate = read_model_rate(*redis, model_).value();
  ASSERT_TRUE(rate);
  EXPECT_NEAR(*rate, taken / seconds, 0.5 * taken / seconds) << taken << " in " << seconds << " s";
}

TEST_F(FairRelayTest, AnAccountsHigherPriorityBatchGoesFirst) {
  const std::string background = submit_as(account_, 1000);
  const std::string urgent = submit_as(account_, 30, 5);
  auto d = windowed(100);
  ASSERT_TRUE(d->relay_once().is_ok());
  std::vector<std::string> order = stream_batches();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 30; ++i) EXPECT_EQ(order[i], urgent) << i;
  EXPECT_EQ(get_batch(*conn_, account_, urgent).value().priority, 5);
  // The account's default priority applies to a batch naming none.
  ASSERT_TRUE(set_account_share(*conn_, "acct", std::nullopt, -7).is_ok());
  EXPECT_EQ(get_batch(*conn_, account_, submit_as(account_, 1)).value().priority, -7);
  EXPECT_EQ(get_batch(*conn_, account_, background).value().priority, 0);
}

TEST_F(LeaseTest, TwoDispatchersAndTwoConsumersCompleteEachRequestOnce) {
  const int n = 2000;
  std::string batch = submit(n);
  std::atomic<bool> stop{false};
  std::atomic<int> accepted{0};
  std::atomic<int> rejected{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back([&, k] {
      auto d = dispatcher();
      DispatcherOptions o;
      o.name = "d" + std::to_string(k);
      while (!stop) {
        (void)d->tick();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
    threads.emplace_back([&, k] {
      auto c = consumer("c" + std::to_string(k));
      while (!stop) {
        auto got = c->pull(64, 100);
        if (!got.is_ok() || got->empty()) continue;
        auto r = c->complete(completions(*got, "c" + std::to_string(k)));
        if (!r.is_ok()) continue;
        for (bool b : *r) (b ? accepted : rejected) += 1;
      }
    });
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (status_of(batch) != "completed" && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(status_of(batch), "completed");
  EXPECT_EQ(accepted.load(), n);
  EXPECT_EQ(scalar("SELECT count(*) FROM requests WHERE status = 'completed' AND attempt = 1"), n);
  EXPECT_EQ(scalar("SELECT count(*) FROM outbox WHERE event_type = 'batch.completed'"), 1);
}

}  // namespace
}  // namespace hr::queue
