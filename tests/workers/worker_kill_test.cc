// Worker processes killed with SIGKILL mid-batch, several times: their leases expire, the janitor
// re-queues the work, and every request still ends completed exactly once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <thread>

#include "queue/dispatcher.h"
#include "tests/testing/api_harness.h"
#include "tests/testing/process.h"

namespace hr::workers {
namespace {

using nlohmann::json;

pid_t spawn_worker(testing::ApiHarness& h, const std::string& name) {
  std::string model_dir = std::string(HEADROOM_SOURCE_DIR) + "/models/tiny-reverse";
  std::vector<std::string> args = {HEADROOM_BINARY,
                                   "--log-level",
                                   "warn",
                                   "worker",
                                   "--model",
                                   model_dir,
                                   "--name",
                                   h.model(),
                                   "--worker-name",
                                   name,
                                   "--database-url",
                                   h.database_url(),
                                   "--redis-url",
                                   h.redis_url(),
                                   "--lease-seconds",
                                   "2",
                                   "--max-num-seqs",
                                   "8",
                                   "--reserve-slots",
                                   "0",
                                   "--max-pull",
                                   "8"};
  return testing::spawn(std::move(args));
}

TEST(WorkerKillTest, KilledWorkersLoseNothingAndCompleteEachRequestOnce) {
  testing::ApiHarness h;
  ASSERT_TRUE(h.ok());
  std::atomic<bool> stop{false};
  std::thread dispatcher([&] {
    queue::DispatcherOptions o;
    o.tick_ms = 100;
    o.max_attempts = 10;
    o.reclaim_idle_ms = 3000;
    auto d = queue::Dispatcher::create(h.database_url(), h.redis_url(), o);
    if (d.is_ok()) (*d)->run(stop);
  });
  json reqs = json::array();
  std::mt19937 rng(5);
  for (int i = 0; i < 400; ++i) {
    std::string s;
    for (int k = 0, n = 8 + static_cast<int>(rng() % 24); k < n; ++k)
      s += static_cast<char>('a' + rng() % 26);
    reqs.push_back({{"prompt", "reverse: " + s}, {"temperature", 0}});
  }
  std::string id = h.submit(reqs, h.key_a());
  ASSERT_FALSE(id.empty());
  pid_t steady = spawn_worker(h, "steady");
  int kills = 0;
  for (int round = 0; round < 3; ++round) {
    pid_t victim = spawn_worker(h, "victim-" + std::to_string(round));
    // Let it take leases and start work, then kill it without warning.
    for (int i = 0; i < 100; ++i) {
      if (h.scalar("SELECT count(*) FROM requests WHERE lease_owner = 'victim-" +
                   std::to_string(round) + "'") > 0) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_EQ(kill(victim, SIGKILL), 0);
    waitpid(victim, nullptr, 0);
    ++kills;
  }
  std::string status;
  for (int i = 0; i < 1200 && status != "completed"; ++i) {
    status = h.get("/v1/async/" + id, h.key_a()).json()["result"]["status"];
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(steady, SIGTERM);
  waitpid(steady, nullptr, 0);
  stop = true;
  dispatcher.join();
  EXPECT_EQ(kills, 3);
  EXPECT_EQ(status, "completed");
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE status = 'completed'"), 400);
  EXPECT_EQ(h.scalar("SELECT num_completed FROM batches"), 400);
  // Some requests were taken over from killed workers (attempt > 1), and each was recorded once.
  EXPECT_GT(h.scalar("SELECT count(*) FROM requests WHERE attempt > 1"), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM outbox WHERE event_type = 'batch.completed'"), 1);
}

}  // namespace
}  // namespace hr::workers
