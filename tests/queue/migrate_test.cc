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
