// Migrations against a real Postgres: idempotence, concurrency under the advisory lock, failure
// atomicity, and refusal of edited migrations.
#include "queue/migrate.h"

#include <gtest/gtest.h>
#include <pqxx/pqxx>

#include <atomic>
#include <chrono>
#include <thread>

#include "tests/testing/test_db.h"

namespace hr::queue {
namespace {

int count_rows(const std::string& url, const std::string& sql) {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  return tx.exec1(sql)[0].as<int>();
}

bool table_exists(const std::string& url, const std::string& table) {
  return count_rows(url,
                    "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND "
                    "tablename = '" +
                        table + "'") == 1;
}

Migration mig(const std::string& name, const std::string& sql) {
  return make_migration(name, sql).value();
}

TEST(MigrateTest, BundledMigrationsApplyOnceThenNothing) {
  testing::TestDatabase db;
  ASSERT_TRUE(db.ok());
  const auto& all = bundled_migrations();
  ASSERT_GE(all.size(), 2u);
  auto first = migrate(db.url(), all);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_EQ(first->applied.size(), all.size());
  EXPECT_EQ(first->num_already_applied, 0);
  EXPECT_TRUE(table_exists(db.url(), "batches"));
  EXPECT_TRUE(table_exists(db.url(), "requests"));

  auto second = migrate(db.url(), all);
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  EXPECT_TRUE(second->applied.empty());
  EXPECT_EQ(second->num_already_applied, static_cast<int>(all.size()));
  EXPECT_EQ(count_rows(db.url(), "SELECT count(*) FROM schema_migrations"),
            static_cast<int>(all.size()));
}

// Retention (0006) and partitioning the requests table (0007) keep every existing row, in place,
// and the table works as before: reads by key, new batches, and ids made by a clock ahead of this
// one.
TEST(MigrateTest, PartitioningKeepsEveryExistingRequest) {
  testing::TestDatabase db;
  ASSERT_TRUE(db.ok());
  std::vector<Migration> before;
  for (const Migration& m : bundled_migrations()) {
    if (m.name < "0006") before.push_back(m);
  }
  ASSERT_TRUE(migrate(db.url(), before).is_ok());
  {
    pqxx::connection c(db.url());
    pqxx::nontransaction tx(c);
    tx.exec("INSERT INTO accounts (id, name) VALUES (gen_random_uuid(), 'a')");
    // Two batches: one from 2024, one whose id was made an hour ahead of this clock.
    std::string ahead = tx.exec1(
                              "SELECT (lpad(to_hex((extract(epoch FROM now() + interval "
                              "'1 hour') * 1000)::bigint), 12, '0') || "
                              "'70008000000000000001')::uuid::text")[0]
                            .as<std::string>();
    for (const std::string& id : {std::string("018f0000-0000-7000-8000-000000000001"), ahead}) {
      tx.exec(
          "INSERT INTO batches (id, account_id, model, api_shape, status, num_total) "
          "SELECT '" +
          id + "', id, 'm', 'workers_ai', 'queued', 5000 FROM accounts");
      tx.exec("INSERT INTO requests (batch_id, idx, body) SELECT '" + id +
              "', g, '{\"n\": ' || g || '}' FROM generate_series(0, 4999) g");
    }
  }
  int64_t checksum_before = count_rows(db.url(), "SELECT sum(idx) + count(*) FROM requests");
  auto r = migrate(db.url(), bundled_migrations());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(count_rows(db.url(), "SELECT count(*) FROM requests"), 10000);
  EXPECT_EQ(count_rows(db.url(), "SELECT sum(idx) + count(*) FROM requests"), checksum_before);
  EXPECT_EQ(count_rows(db.url(), "SELECT count(*) FROM requests_legacy"), 10000)
      << "the old table is the first partition, rows in place";
  EXPECT_EQ(count_rows(db.url(),
                       "SELECT count(*) FROM pg_inherits WHERE inhparent = "
                       "'requests'::regclass"),
            2);  // the old table and the default
  EXPECT_EQ(count_rows(db.url(),
                       "SELECT count(*) FROM requests WHERE batch_id = "
                       "'018f0000-0000-7000-8000-000000000001' AND idx = 4321 AND "
                       "body = '{\"n\": 4321}'"),
            1);
  // A new batch's requests go to the default partition until the dispatcher makes theirs.
  pqxx::connection c(db.url());
  pqxx::work tx(c);  // one now() for both
  tx.exec(
      "INSERT INTO batches (id, account_id, model, api_shape, status, num_total, "
      "retain_seconds, expires_at) SELECT hr_uuid_v7_floor(now() + interval '2 hours'), id, "
      "'m', 'workers_ai', 'queued', 1, 60, now() FROM accounts");
  tx.exec(
      "INSERT INTO requests (batch_id, idx, body) SELECT hr_uuid_v7_floor(now() + interval "
      "'2 hours'), 0, '{}'");
  tx.commit();
  EXPECT_EQ(count_rows(db.url(), "SELECT count(*) FROM requests_default"), 1);
  // Restartable: the whole migration is one transaction, and applying again does nothing.
  auto again = migrate(db.url(), bundled_migrations());
  ASSERT_TRUE(again.is_ok());
  EXPECT_TRUE(again->applied.empty());
}

TEST(MigrateTest, ConcurrentMigratorsApplyExactlyOnce) {
  testing::TestDatabase db;
  ASSERT_TRUE(db.ok());
  // A slow migration widens the window in which the two runs overlap.
  std::vector<Migration> files = {
      mig("0001_a.sql", "CREATE TABLE a (x int); SELECT pg_sleep(0.3);"),
      mig("0002_b.sql", "CREATE TABLE b (x int);"),
  };
  std::atomic<int> started{0};
  Result<MigrateReport> r1 = Status(StatusCode::kInternal, "not run");
  Result<MigrateReport> r2 = Status(StatusCode::kInternal, "not run");
  std::thread t1([&] {
    ++started;
    r1 = migrate(db.url(), files);
  });
  std::thread t2([&] {
    ++started;
    r2 = migrate(db.url(), files);
  });
  t1.join();
  t2.join();
  ASSERT_TRUE(r1.is_ok()) << r1.status().to_string();
  ASSERT_TRUE(r2.is_ok()) << r2.status().to_string();
  EXPECT_EQ(r1->applied.size() + r2->applied.size(), 2u);
  EXPECT_TRUE((r1->applied.size() == 2 && r2->num_already_applied == 2) ||
              (r2->applied.size() == 2 && r1->num_already_applied == 2));
  EXPECT_EQ(count_rows(db.url(), "SELECT count(*) FROM schema_migrations"), 2);
}

TEST(MigrateTest, SecondMigratorWaitsForTheLock) {
  testing::TestDatabase db;
  ASSERT_TRUE(db.ok());
  std::vector<Migration> files = {mig("0001_a.sql", "CREATE TABLE a (x int);")};
  // Hold the migration lock from another session, as a running migrator would.
  pqxx::connection holder(db.url());
  pqxx::nontransaction(holder).exec("SELECT pg_advisory_lock(" +
                                    std::to_string(0x68726d6967726174) + ")");
  std::atomic<bool> done{false};
  Result<MigrateReport> r = Status(StatusCode::kInternal, "not run");
  std::thread t([&] {
    r = migrate(db.url(), files);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done.load()) << "migrator ran while another held the lock";
  EXPECT_FALSE(table_exists(db.url(), "a"));
  pqxx::nontransaction(holder).exec("SELECT pg_advisory_unlock(" +
                                    std::to_string(0x68726d6967726174) + ")");
  t.join();
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->applied.size(), 1u);
}

TEST(MigrateTest, FailedMigrationLeavesSchemaAsItWasAndNamesTheFile) {
  testing::TestDatabase db;
  ASSERT_TRUE(db.ok());
  std::vector<Migration> files = {
      mig("0001_ok.sql", "CREATE TABLE ok_table (x int);"),
      mig("0002_bad.sql", "CREATE TABLE half (x int); SELECT no_such_column FROM ok_table;"),
  };
  auto r = migrate(db.url(), files);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("0002_bad.sql"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("no_such_column"), std::string::npos) << r.status().message();
  EXPECT_TRUE(table_exists(db.url(), "ok_table"));
  EXPECT_FALSE(table_exists(db.url(), "half"));
  EXPECT_EQ(count_rows(db.url(), "SELECT count(*) FROM schema_migrations"), 1);
}

TEST(MigrateTest, EditedMigrationIsRefused) {
  testing::TestDatabase db;
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE(migrate(db.url(), {mig("0001_a.sql", "CREATE TABLE a (x int);")}).is_ok());
  auto r = migrate(db.url(), {mig("0001_a.sql", "CREATE TABLE a (x bigint);")});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("0001_a.sql"), std::string::npos);
}

TEST(MigrateTest, UnreachableServerIsUnavailable) {
  auto r = migrate("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2", bundled_migrations());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

TEST(MigrateTest, BadFileNamesAreRejected) {
  EXPECT_FALSE(make_migration("1_short.sql", "").is_ok());
  EXPECT_FALSE(make_migration("0001_x.txt", "").is_ok());
  EXPECT_FALSE(make_migration("abcd_x.sql", "").is_ok());
  EXPECT_TRUE(make_migration("0042_fine.sql", "").is_ok());
}

}  // namespace
}  // namespace hr::queue
