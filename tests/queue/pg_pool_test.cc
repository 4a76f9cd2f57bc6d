// PgPool against a real Postgres: a thread keeps its connection until it gives it back; a given-
// back connection is lent again without reopening; no more than `size` are ever open; a thread
// that finds all lent waits for one, or gets kResourceExhausted after the wait; a dropped
// connection frees its place; an unreachable server is kUnavailable and takes no place.
#include "queue/pg_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "queue/pg.h"
#include "tests/testing/test_db.h"

namespace hr::queue {
namespace {

using std::chrono::milliseconds;

// The server process behind a connection.
int backend_pid(pqxx::connection& c) {
  pqxx::nontransaction tx(c);
  return tx.exec1("SELECT pg_backend_pid()")[0].as<int>();
}

// Sessions connected to `db`, as the server counts them, once they number `expected` (a closed
// session's server process takes a moment to leave): waits up to 2 s for that.
int sessions(const hr::testing::TestDatabase& db, int expected) {
  pqxx::connection admin(hr::testing::admin_database_url());
  int n = -1;
  for (int i = 0; i < 100 && n != expected; ++i) {
    if (i > 0) std::this_thread::sleep_for(milliseconds(20));
    pqxx::nontransaction tx(admin);
    n = tx.exec1("SELECT count(*) FROM pg_stat_activity WHERE datname = " + tx.quote(db.name()))[0]
            .as<int>();
  }
  return n;
}

// The server session of a connection borrowed on another thread and given back at once; -1 when
// none could be borrowed.
int pid_on_another_thread(PgPool& pool) {
  return std::async(std::launch::async,
                    [&] {
                      auto c = pool.connection();
                      const int pid = c.is_ok() ? backend_pid(**c) : -1;
                      pool.release();
                      return pid;
                    })
      .get();
}

TEST(PgPoolTest, AThreadKeepsItsConnectionUntilItGivesItBack) {
  hr::testing::TestDatabase db;
  ASSERT_TRUE(db.ok());
  PgPool pool(db.url(), 2, milliseconds(2000));
  auto a = pool.connection();
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  auto again = pool.connection();
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(*a, *again);
  const int pid = backend_pid(**a);
  EXPECT_EQ(pool.lent(), 1);
  pool.release();
  EXPECT_EQ(pool.lent(), 0);
  EXPECT_EQ(pool.open(), 1);
  pool.release();  // holding none: nothing happens
  // Another thread gets the same server session: given back, not closed.
  EXPECT_EQ(pid_on_another_thread(pool), pid);
  EXPECT_EQ(pool.open(), 1);
  EXPECT_EQ(sessions(db, 1), 1);
}

TEST(PgPoolTest, NoMoreThanSizeAreOpenAndAWaitingThreadGetsOneGivenBack) {
  hr::testing::TestDatabase db;
  ASSERT_TRUE(db.ok());
  PgPool pool(db.url(), 2, milliseconds(5000));
  std::promise<void> hold_a, hold_b;
  std::shared_future<void> go_a = hold_a.get_future().share(), go_b = hold_b.get_future().share();
  std::atomic<int> holding{0};
  auto holder = [&](std::shared_future<void> go) {
    auto c = pool.connection();
    EXPECT_TRUE(c.is_ok());
    ++holding;
    go.wait();
    pool.release();
  };
  std::thread ta(holder, go_a), tb(holder, go_b);
  while (holding < 2) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(pool.lent(), 2);
  // A third thread waits; it gets a connection once one is given back, and none is opened for it.
  auto third = std::async(std::launch::async, [&] {
    auto c = pool.connection();
    const bool ok = c.is_ok();
    pool.release();
    return ok;
  });
  EXPECT_EQ(third.wait_for(milliseconds(300)), std::future_status::timeout);
  hold_a.set_value();
  EXPECT_TRUE(third.get());
  hold_b.set_value();
  ta.join();
  tb.join();
  EXPECT_EQ(pool.open(), 2);
  EXPECT_EQ(sessions(db, 2), 2);
}

TEST(PgPoolTest, AThreadThatFindsAllLentGetsResourceExhaustedAfterTheWait) {
  hr::testing::TestDatabase db;
  ASSERT_TRUE(db.ok());
  PgPool pool(db.url(), 1, milliseconds(150));
  ASSERT_TRUE(pool.connection().is_ok());
  auto other = std::async(std::launch::async, [&] {
                 const auto t0 = std::chrono::steady_clock::now();
                 auto c = pool.connection();
                 return std::make_pair(c.status(), std::chrono::steady_clock::now() - t0);
               }).get();
  EXPECT_EQ(other.first.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(other.first.message().find("all 1 database connections are busy"), std::string::npos);
  EXPECT_GE(other.second, milliseconds(150));
  // Dropped (broken): its place is free, and the next borrower opens a new session.
  const int pid = backend_pid(**pool.connection());
  pool.drop();
  EXPECT_EQ(pool.open(), 0);
  const int next = pid_on_another_thread(pool);
  EXPECT_GT(next, 0);
  EXPECT_NE(next, pid);
  EXPECT_EQ(sessions(db, 1), 1);
}

TEST(PgPoolTest, AnUnreachableServerIsUnavailableAndTakesNoPlace) {
  PgPool pool("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2", 1, milliseconds(100));
  for (int i = 0; i < 2; ++i) {
    auto c = pool.connection();
    EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().to_string();
  }
  EXPECT_EQ(pool.open(), 0);
}

// Every connection carries session timeouts, unless its URL sets them: a statement past 60 s and
// a lock wait past 10 s fail instead of holding their caller (with_client_timeouts).
TEST(PgPoolTest, ConnectionsCarrySessionTimeoutsUnlessTheUrlSetsThem) {
  EXPECT_EQ(with_client_timeouts("postgresql://u@h/db"),
            "postgresql://u@h/db?connect_timeout=2&keepalives=1&keepalives_idle=10&"
            "keepalives_interval=5&keepalives_count=3&options=-c%20statement_timeout%3D60000%20-c%"
            "20lock_timeout%3D10000");
  EXPECT_EQ(with_client_timeouts("host=h dbname=db keepalives_idle=30"),
            "host=h dbname=db keepalives_idle=30 connect_timeout=2 keepalives=1 "
            "keepalives_interval=5 keepalives_count=3 options='-c statement_timeout=60000 -c "
            "lock_timeout=10000'");
  EXPECT_EQ(with_client_timeouts("postgresql://h/db?options=-c%20lock_timeout%3D5&connect_timeout=9"
                                 "&keepalives=0&keepalives_idle=1&keepalives_interval=1&"
                                 "keepalives_count=1"),
            "postgresql://h/db?options=-c%20lock_timeout%3D5&connect_timeout=9&keepalives=0&"
            "keepalives_idle=1&keepalives_interval=1&keepalives_count=1");
  hr::testing::TestDatabase db;
  PgPool pool(db.url(), 2, milliseconds(1000));
  auto c = pool.connection();
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  pqxx::nontransaction tx(**c);
  EXPECT_EQ(tx.exec1("SHOW statement_timeout")[0].as<std::string>(), "1min");
  EXPECT_EQ(tx.exec1("SHOW lock_timeout")[0].as<std::string>(), "10s");
}

// A lock wait past the session's lock_timeout fails kUnavailable (retryable: the API answers 503
// with Retry-After) rather than waiting for as long as the lock is held.
TEST(PgPoolTest, ALockWaitPastTheLockTimeoutIsUnavailable) {
  hr::testing::TestDatabase db;
  const std::string url = db.url() + (db.url().find('?') == std::string::npos ? "?" : "&") +
                          "options=-c%20lock_timeout%3D300";
  pqxx::connection holder(db.url());
  pqxx::nontransaction(holder).exec(
      "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)");
  pqxx::work hold(holder);
  hold.exec("SELECT * FROM t FOR UPDATE");
  auto c = pg_connect(url);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const auto t0 = std::chrono::steady_clock::now();
  Status st = pg_guard("lock", [&]() -> Status {
    pqxx::work tx(**c);
    tx.exec("UPDATE t SET id = 2 WHERE id = 1");
    return Status::ok();
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(secs, 0.25);
  EXPECT_LT(secs, 3.0);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("lock timeout"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace hr::queue
