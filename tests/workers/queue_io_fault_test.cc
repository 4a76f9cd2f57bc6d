// The worker's queue thread (workers/queue_io.h) while Postgres is down, on a private stack: its
// result writes back off (100 ms doubling to 5 s, with jitter) instead of retrying at once, its
// warnings come as a few counted lines, it uses next to no CPU, and once Postgres is back every
// result is recorded, none twice.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "queue/dispatcher.h"
#include "queue/migrate.h"
#include "queue/store.h"
#include "tests/testing/stack.h"
#include "workers/queue_io.h"
#include "workers/worker.h"

namespace hr::workers {
namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

TEST(QueueIoFaultTest, PostgresDownBacksOffQuietlyThenRecordsEveryResult) {
  hr::testing::PrivateStack stack;
  ASSERT_TRUE(stack.ok());
  ASSERT_TRUE(queue::migrate(stack.database_url(), queue::bundled_migrations()).is_ok());
  pqxx::connection conn(stack.database_url());
  const std::string model = "@test/queue-io";
  const int n = 20;
  queue::NewBatch b;
  b.account_id = queue::create_api_key(conn, "acct").value().account_id;
  b.model = model;
  for (int i = 0; i < n; ++i) b.requests.push_back({std::nullopt, "{}", 0, std::nullopt});
  const std::string batch = queue::submit_batch(conn, b).value().batch_id;
  auto dispatcher = queue::Dispatcher::create(stack.database_url(), stack.redis_url(), {}).value();

  WorkerConfig config;
  config.model_name = model;
  config.worker_name = "w";
  queue::StoreConfig store{stack.database_url(), stack.redis_url(), ""};
  WorkerStats stats;
  QueueIo io(config, store, stats, [] {});
  io.start();
  std::vector<queue::Lease> leases;
  for (int i = 0; i < 200 && static_cast<int>(leases.size()) < n; ++i) {
    (void)dispatcher->tick();
    io.want(n - static_cast<int>(leases.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (auto& l : io.take_pulled()) leases.push_back(std::move(l));
  }
  ASSERT_EQ(static_cast<int>(leases.size()), n);
  io.want(0);

  std::mutex mu;
  std::vector<std::string> lines;
  log::set_sink([&](std::string_view l) {
    std::lock_guard<std::mutex> lock(mu);
    lines.emplace_back(l);
  });
  ASSERT_TRUE(stack.stop_postgres());
  const double cpu0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (const queue::Lease& l : leases) io.complete({l, "{\"response\":\"x\"}", 1, 1, 0});
  std::this_thread::sleep_for(std::chrono::seconds(8));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = cpu_seconds() - cpu0;
  size_t down_lines = 0, failed_lines = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    down_lines = lines.size();
    for (const auto& l : lines)
      failed_lines += l.find("worker.complete_failed") != std::string::npos;
  }
  EXPECT_GE(failed_lines, 1u) << "the failure is not silent";
  EXPECT_LE(down_lines, 5u) << "a storm of warnings: " << (down_lines ? lines[0] : "");
  EXPECT_LT(cpu / wall, 0.10) << cpu << " s of CPU in " << wall << " s";
  EXPECT_EQ(stats.completed.load(), 0);

  ASSERT_TRUE(stack.start_postgres());
  for (int i = 0; i < 300 && stats.completed.load() < n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(stats.completed.load(), n) << "recorded within 15 s of Postgres' return";
  io.stop({});
  log::set_sink(nullptr);
  bool recovered = false;
  for (const auto& l : lines)
    recovered |= l.find("worker.complete_failed.recovered") != std::string::npos;
  EXPECT_TRUE(recovered);
  pqxx::connection again(stack.database_url());
  pqxx::nontransaction tx(again);
  EXPECT_EQ(tx.exec1("SELECT count(*) FROM requests WHERE status = 'completed'")[0].as<int>(), n);
  EXPECT_EQ(
      tx.exec_params1("SELECT num_completed FROM batches WHERE id = $1::uuid", batch)[0].as<int>(),
      n);
}

// Idle, holding no lease, past the first renewal time (a third of the lease): the thread sleeps
// between its looks at the queue (every idle_poll_ms) rather than spinning on a renewal that is
// always due.
TEST(QueueIoFaultTest, AnIdleWorkerHoldingNothingSleepsPastItsRenewalTime) {
  hr::testing::PrivateStack stack;
  ASSERT_TRUE(stack.ok());
  ASSERT_TRUE(queue::migrate(stack.database_url(), queue::bundled_migrations()).is_ok());
  WorkerConfig config;
  config.model_name = "@test/queue-io-idle";
  config.worker_name = "w";
  config.lease_seconds = 3;  // a renewal due every second
  queue::StoreConfig store{stack.database_url(), stack.redis_url(), ""};
  WorkerStats stats;
  QueueIo io(config, store, stats, [] {});
  io.start();
  io.want(8);  // room for work, and none queued: it looks every idle_poll_ms
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const double before = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double used = cpu_seconds() - before;
  io.stop({});
  EXPECT_LT(used, 0.1) << "CPU seconds in 2 s of idling";
}

}  // namespace
}  // namespace hr::workers
