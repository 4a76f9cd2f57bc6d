// The relay's streams against real Postgres and Redis. Cache-aware dispatch: the relay sends
// requests with one affinity to one live worker's own stream, that worker reads it first, an idle
// worker takes from another's, and a departed worker's stream goes back to the shared one.
// Catch-up: an account far behind its share goes to the catch-up stream, which the workers split.
#include <gtest/gtest.h>
#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "base/ids.h"
#include "queue/accounts.h"
#include "queue/dispatcher.h"
#include "queue/lease.h"
#include "queue/migrate.h"
#include "queue/registry.h"
#include "queue/store.h"
#include "queue/stream.h"
#include "tests/testing/test_db.h"

namespace hr::queue {
namespace {

class CacheDispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    redis_url_ = hr::testing::redis_url();
    ASSERT_TRUE(db_.ok());
    ASSERT_FALSE(redis_url_.empty());
    ASSERT_TRUE(migrate(db_.url(), bundled_migrations()).is_ok());
    conn_ = std::make_unique<pqxx::connection>(db_.url());
    auto key = create_api_key(*conn_, "acct");
    ASSERT_TRUE(key.is_ok());
    account_ = key->account_id;
    model_ = "@test/cache-" + random_hex(4);
    registry_ = WorkerRegistry::connect(redis_url_).value();
    redis_ = RedisClient::connect(redis_url_).value();
  }

  void TearDown() override {
    for (const std::string& w : announced_) (void)registry_->withdraw(model_, w);
  }

  void announce(const std::string& worker) {
    WorkerInfo w;
    w.id = worker;
    w.model = model_;
    w.url = "http://127.0.0.1:1";
    w.capacity = 8;
    ASSERT_TRUE(registry_->announce(w, 60000).is_ok());
    announced_.insert(worker);
  }

  // A batch of `n` requests, request i with affinity affinity(i) (none when it returns nullopt).
  std::string submit(int n, const std::function<std::optional<int64_t>(int)>& affinity) {
    NewBatch b;
    b.account_id = account_;
    b.model = model_;
    for (int i = 0; i < n; ++i) {
      NewRequest r;
      r.body = "{\"prompt\":\"p\"}";
      r.affinity = affinity(i);
      b.requests.push_back(r);
    }
    auto r = submit_batch(*conn_, b);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? r->batch_id : "";
  }

  // A batch of `n` requests without an affinity of a new account, "tenant-b".
  std::string submit_for_newcomer(int n) {
    auto key = create_api_key(*conn_, "tenant-b");
    EXPECT_TRUE(key.is_ok());
    if (!key.is_ok()) return "";
    NewBatch b;
    b.account_id = key->account_id;
    b.model = model_;
    b.requests.resize(static_cast<size_t>(n));
    for (NewRequest& r : b.requests) r.body = "{\"prompt\":\"p\"}";
    auto r = submit_batch(*conn_, b);
    EXPECT_TRUE(r.is_ok());
    return r.is_ok() ? r->batch_id : "";
  }

  std::unique_ptr<Dispatcher> dispatcher(bool by_prefix = true) {
    DispatcherOptions o;
    o.dispatch_by_prefix = by_prefix;
    auto d = Dispatcher::create(db_.url(), redis_url_, o);
    EXPECT_TRUE(d.is_ok());
    return std::move(d).value();
  }

  std::unique_ptr<LeaseClient> consumer(const std::string& owner) {
    auto c = LeaseClient::create(db_.url(), redis_url_, {model_, owner, 30000, 3});
    EXPECT_TRUE(c.is_ok());
    return std::move(c).value();
  }

  int64_t length(const std::string& key) { return redis_->command({"XLEN", key}).value().integer; }

  std::map<int, int64_t> affinity_of_leases(const std::vector<Lease>& leases) {
    std::map<int, int64_t> out;
    pqxx::nontransaction tx(*conn_);
    for (const Lease& l : leases) {
      out[l.ref.idx] = tx.exec_params1(
                             "SELECT affinity FROM requests WHERE batch_id = $1::uuid "
                             "AND idx = $2",
                             l.ref.batch_id, l.ref.idx)[0]
                           .as<int64_t>();
    }
    return out;
  }

  hr::testing::TestDatabase db_;
  std::string redis_url_;
  std::unique_ptr<pqxx::connection> conn_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<RedisClient> redis_;
  std::set<std::string> announced_;
  std::string account_;
  std::string model_;
};

TEST_F(CacheDispatchTest, RequestsWithOneAffinityGoToOneWorkerWhichReadsThemFirst) {
  announce("w1");
  announce("w2");
  // Four prefixes, five requests each, interleaved; and four without an affinity.
  submit(24, [](int i) { return i < 20 ? std::optional<int64_t>(1000 + i % 4) : std::nullopt; });
  auto d = dispatcher();
  auto tick = d->tick();
  ASSERT_TRUE(tick.is_ok()) << tick.status().to_string();
  EXPECT_EQ(tick->relayed, 24);
  EXPECT_EQ(length(stream_key(model_)), 4);  // the four without an affinity
  const int64_t own1 = length(worker_stream_key(model_, "w1"));
  const int64_t own2 = length(worker_stream_key(model_, "w2"));
  EXPECT_EQ(own1 + own2, 20);
  EXPECT_EQ(own1 % 5, 0) << "each prefix's five requests in one worker's stream";
  EXPECT_EQ(workers_with_streams(*redis_, model_).value().size(),
            static_cast<size_t>((own1 > 0) + (own2 > 0)));
  // Each worker pulls its own before the shared stream's, and every request of one prefix is on
  // one worker.
  auto c1 = consumer("w1");
  auto c2 = consumer("w2");
  std::vector<Lease> got1 = c1->pull(static_cast<int>(own1), 0).value();
  std::vector<Lease> got2 = c2->pull(static_cast<int>(own2), 0).value();
  ASSERT_EQ(static_cast<int64_t>(got1.size()), own1);
  ASSERT_EQ(static_cast<int64_t>(got2.size()), own2);
  std::map<int64_t, std::set<std::string>> workers_of;
  for (auto [idx, a] : affinity_of_leases(got1)) workers_of[a].insert("w1");
  for (auto [idx, a] : affinity_of_leases(got2)) workers_of[a].insert("w2");
  EXPECT_EQ(workers_of.size(), 4u);
  for (const auto& [a, ws] : workers_of) EXPECT_EQ(ws.size(), 1u) << "affinity " << a;
  for (const Lease& l : got1) EXPECT_EQ(l.stream, worker_stream_key(model_, "w1"));
  // The shared stream's four next; completing acks each in its own stream.
  std::vector<Lease> rest = c1->pull(10, 0).value();
  ASSERT_EQ(rest.size(), 4u);
  for (const Lease& l : rest) EXPECT_EQ(l.stream, stream_key(model_));
  std::vector<Completion> done;
  for (const auto* set : {&got1, &got2, &rest}) {
    for (const Lease& l : *set) done.push_back({l, "{\"response\":\"ok\"}", 1, 1, 0});
  }
  ASSERT_TRUE(c1->complete(done).is_ok());
  EXPECT_EQ(length(worker_stream_key(model_, "w1")), 0);
  EXPECT_EQ(length(worker_stream_key(model_, "w2")), 0);
  EXPECT_EQ(length(stream_key(model_)), 0);
}

// Fair share reaches the workers' own streams: a newcomer's requests routed to a worker whose
// stream holds another account's waiting backlog are not queued behind it; that backlog is taken
// back and the window pushed again shared and interleaved, nothing lost or doubled.
TEST_F(CacheDispatchTest, ANewcomerIsNotQueuedBehindAWorkersStreamBacklog) {
  announce("w1");
  const std::string big = submit(3000, [](int) { return std::optional<int64_t>(7); });
  DispatcherOptions o;
  o.window = {100, 100, 250};
  o.newcomer_check_ms = 0;
  o.catch_up_below = 0;  // the newcomer's requests in the streams, not the catch-up one
  auto d = Dispatcher::create(db_.url(), redis_url_, o).value();
  ASSERT_TRUE(d->relay_once().is_ok());
  const std::string own = worker_stream_key(model_, "w1");
  ASSERT_EQ(length(own), 100);  // A's, waiting: no worker took any
  auto key_b = create_api_key(*conn_, "tenant-b");
  ASSERT_TRUE(key_b.is_ok());
  NewBatch nb;
  nb.account_id = key_b->account_id;
  nb.model = model_;
  for (int i = 0; i < 50; ++i) {
    NewRequest r;
    r.body = "{\"prompt\":\"p\"}";
    r.affinity = 9;
    nb.requests.push_back(r);
  }
  const std::string small = submit_batch(*conn_, nb).value().batch_id;
  ASSERT_TRUE(d->relay_once().is_ok());
  auto entries = redis_->command({"XRANGE", own, "-", "+"}).value();
  std::vector<std::string> order;
  for (const auto& e : entries.elements) order.push_back(e.elements[1].elements[1].str);
  int small_in_front = 0;
  for (size_t i = 0; i < std::min<size_t>(20, order.size()); ++i)
    small_in_front += order[i] == small;
  EXPECT_GE(small_in_front, 8);
  EXPECT_EQ(std::count(order.begin(), order.end(), small), 50);
  auto c = consumer("w1");
  std::set<std::pair<std::string, int>> seen;
  auto t0 = std::chrono::steady_clock::now();
  while (seen.size() < 3050 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    ASSERT_TRUE(d->relay_once().is_ok());
    auto got = c->pull(500, 50);
    ASSERT_TRUE(got.is_ok());
    std::vector<Completion> done;
    for (const Lease& l : *got) {
      EXPECT_TRUE(seen.insert({l.ref.batch_id, l.ref.idx}).second);
      done.push_back({l, "{\"response\":\"ok\"}", 1, 1, 0});
    }
    ASSERT_TRUE(c->complete(done).is_ok());
  }
  EXPECT_EQ(seen.size(), 3050u);
}

// A newcomer far behind the account whose work fills the workers goes to the catch-up stream,
// which each live worker reads past its headroom, taking its part.
TEST_F(CacheDispatchTest, ANewcomerFarBehindGoesToTheCatchUpStreamThatTheWorkersSplit) {
  announce("w1");
  announce("w2");
  const std::string big = submit(3000, [](int) { return std::nullopt; });
  DispatcherOptions o;
  o.window = {100, 100, 250};
  o.newcomer_check_ms = 0;
  auto d = Dispatcher::create(db_.url(), redis_url_, o).value();
  ASSERT_TRUE(d->relay_once().is_ok());
  auto c1 = consumer("w1");
  auto c2 = consumer("w2");
  ASSERT_EQ(c1->pull(80, 0).value().size(), 80u);  // A's, running on w1
  const std::string key_c = catch_up_stream_key(model_);
  EXPECT_EQ(length(key_c), 0);  // A alone: nothing catches up
  const std::string small = submit_for_newcomer(50);
  ASSERT_FALSE(small.empty());
  ASSERT_TRUE(d->relay_once().is_ok());
  // All 50 of B's (it holds 50 against A's 130): none in the other streams.
  EXPECT_EQ(length(key_c), 50);
  auto entries = redis_->command({"XRANGE", stream_key(model_), "-", "+"}).value();
  for (const auto& e : entries.elements) EXPECT_NE(e.elements[1].elements[1].str, small);
  // A catch-up pull takes this worker's half.
  std::vector<Lease> got1 = c1->pull_catch_up(100).value();
  ASSERT_EQ(got1.size(), 25u);
  for (const Lease& l : got1) {
    EXPECT_EQ(l.ref.batch_id, small);
    EXPECT_TRUE(l.catch_up);
    EXPECT_EQ(l.stream, key_c);
  }
  // Its half taken, w1 takes no more than its part of what still waits (should w2 not come).
  EXPECT_EQ(c1->pull_catch_up(4).value().size(), 4u);
  EXPECT_EQ(c1->pull_catch_up(100).value().size(), 11u);  // ceil(21 / 2)
  // A plain pull takes what is owed at once first, then the shared stream's.
  const std::vector<Lease> next = c2->pull(20, 0).value();
  ASSERT_EQ(next.size(), 20u);
  for (size_t i = 0; i < next.size(); ++i) {
    EXPECT_EQ(next[i].ref.batch_id, i < 10 ? small : big) << i;
    EXPECT_EQ(next[i].catch_up, i < 10) << i;
  }
  EXPECT_TRUE(c2->pull_catch_up(100).value().empty());
  // Completed, their entries leave the stream.
  std::vector<Completion> done;
  for (const Lease& l : got1) done.push_back({l, "{\"response\":\"ok\"}", 1, 1, 0});
  ASSERT_TRUE(c1->complete(done).is_ok());
  EXPECT_EQ(length(key_c), 25);
}

// Redis lost the catch-up stream: the janitor notices (its marker is there, the stream is not)
// and the relay sends its requests again.
TEST_F(CacheDispatchTest, ALostCatchUpStreamIsSentAgain) {
  submit(90, [](int) { return std::nullopt; });
  DispatcherOptions o;
  o.window = {100, 100, 250};
  o.newcomer_check_ms = 0;
  auto d = Dispatcher::create(db_.url(), redis_url_, o).value();
  ASSERT_TRUE(d->tick().is_ok());                               // (a first tick: Redis observed)
  ASSERT_EQ(consumer("w1")->pull(100, 0).value().size(), 90u);  // A's, all running
  ASSERT_FALSE(submit_for_newcomer(5).empty());
  ASSERT_TRUE(d->relay_once().is_ok());
  const std::string key_c = catch_up_stream_key(model_);
  ASSERT_EQ(length(key_c), 5);
  ASSERT_EQ(redis_->command({"DEL", key_c}).value().integer, 1);
  auto tick = d->tick();
  ASSERT_TRUE(tick.is_ok()) << tick.status().to_string();
  EXPECT_EQ(length(key_c), 5);
  EXPECT_EQ(consumer("w2")->pull_catch_up(10).value().size(), 5u);
}

TEST_F(CacheDispatchTest, AnIdleWorkerTakesFromAnothersStream) {
  announce("w1");
  submit(6, [](int) { return std::optional<int64_t>(77); });
  auto d = dispatcher();
  ASSERT_TRUE(d->tick().is_ok());
  auto names = workers_with_streams(*redis_, model_).value();
  ASSERT_EQ(names, std::vector<std::string>{"w1"});
  // w2 has nothing of its own and the shared stream is empty: it takes w1's.
  auto c2 = consumer("w2");
  std::vector<Lease> got = c2->pull(4, 0).value();
  ASSERT_EQ(got.size(), 4u);
  for (const Lease& l : got) EXPECT_EQ(l.stream, worker_stream_key(model_, "w1"));
  EXPECT_EQ(consumer("w1")->pull(10, 0).value().size(), 2u);
}

TEST_F(CacheDispatchTest, ADepartedWorkersStreamGoesBackToTheSharedStream) {
  announce("w1");
  submit(5, [](int) { return std::optional<int64_t>(5); });
  auto d = dispatcher();
  ASSERT_TRUE(d->tick().is_ok());
  ASSERT_EQ(length(worker_stream_key(model_, "w1")), 5);
  // w1 reads two (they are its, leased in Postgres) and leaves.
  ASSERT_EQ(consumer("w1")->pull(2, 0).value().size(), 2u);
  ASSERT_TRUE(registry_->withdraw(model_, "w1").is_ok());
  auto tick = d->tick();
  ASSERT_TRUE(tick.is_ok());
  EXPECT_EQ(tick->reclaimed, 5);
  EXPECT_EQ(redis_->command({"EXISTS", worker_stream_key(model_, "w1")}).value().integer, 0);
  EXPECT_TRUE(workers_with_streams(*redis_, model_).value().empty());
  // A new worker pulls the three still queued; the copies of the two leased are dropped.
  auto c3 = consumer("w3");
  std::vector<Lease> got = c3->pull(10, 0).value();
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(length(stream_key(model_)), 3);  // pending with w3 until completed
  EXPECT_TRUE(c3->pull(10, 0).value().empty());
}

// Redis lost a worker's stream (evicted the key, say): the relay notices the listed stream
// without its group and sends its requests again.
TEST_F(CacheDispatchTest, ALostWorkerStreamIsSentAgain) {
  announce("w1");
  submit(4, [](int) { return std::optional<int64_t>(3); });
  auto d = dispatcher();
  ASSERT_TRUE(d->tick().is_ok());
  ASSERT_EQ(length(worker_stream_key(model_, "w1")), 4);
  ASSERT_EQ(redis_->command({"DEL", worker_stream_key(model_, "w1")}).value().integer, 1);
  auto tick = d->tick();  // the janitor notices and rewinds; the relay sends them again
  ASSERT_TRUE(tick.is_ok()) << tick.status().to_string();
  EXPECT_EQ(tick->relayed, 4);
  EXPECT_EQ(workers_with_streams(*redis_, model_).value(), std::vector<std::string>{"w1"});
  EXPECT_EQ(consumer("w1")->pull(10, 0).value().size(), 4u);
}

TEST_F(CacheDispatchTest, SwitchedOffEverythingGoesToTheSharedStream) {
  announce("w1");
  submit(8, [](int i) { return std::optional<int64_t>(i % 2); });
  auto d = dispatcher(/*by_prefix=*/false);
  ASSERT_TRUE(d->tick().is_ok());
  EXPECT_EQ(length(stream_key(model_)), 8);
  EXPECT_TRUE(workers_with_streams(*redis_, model_).value().empty());
}

TEST_F(CacheDispatchTest, WithoutLiveWorkersEverythingGoesToTheSharedStream) {
  submit(3, [](int) { return std::optional<int64_t>(9); });
  auto d = dispatcher();
  ASSERT_TRUE(d->tick().is_ok());
  EXPECT_EQ(length(stream_key(model_)), 3);
}

}  // namespace
}  // namespace hr::queue
