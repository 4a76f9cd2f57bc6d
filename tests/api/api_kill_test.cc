// A real `headroom api` process killed (SIGKILL) in the middle of storing a 100,000-request
// submit: nothing of the batch is left, and the account's enqueued-requests count, read by a
// second API process, is whole (the quota is counted from committed rows under an advisory lock,
// so a dead process leaves no counter behind).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <pqxx/pqxx>
#include <thread>

#include "tests/testing/api_harness.h"
#include "tests/testing/http_client.h"
#include "tests/testing/process.h"

namespace hr::api {
namespace {

using nlohmann::json;
using testing::ApiHarness;
using testing::HttpResult;

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

pid_t spawn_api(ApiHarness& h, int port) {
  return testing::spawn({HEADROOM_BINARY, "--log-level", "warn", "api", "--port",
                         std::to_string(port), "--database-url", h.database_url(), "--redis-url",
                         h.redis_url(), "--served-model", h.model() + ":128"});
}

bool wait_ready(int port) {
  for (int i = 0; i < 200; ++i) {
    if (testing::http_call("GET", port, "/readyz").status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

std::string batch_of(int n) {
  json reqs = json::array();
  for (int i = 0; i < n; ++i) {
    reqs.push_back(
        {{"messages", {{{"role", "user"}, {"content", "reverse: " + std::to_string(i)}}}},
         {"max_tokens", 8}});
  }
  return json{{"requests", reqs}}.dump();
}

void stop(pid_t pid, int sig) {
  ::kill(pid, sig);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

TEST(ApiKillTest, AnApiKilledMidSubmitLeavesNothingAndTheQuotaWhole) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  h.scalar(
      "WITH u AS (UPDATE accounts SET max_enqueued_requests = 150000 WHERE name = 'alice' "
      "RETURNING 1) SELECT count(*) FROM u");
  const int port_a = free_port(), port_b = free_port();
  const pid_t a = spawn_api(h, port_a);
  const pid_t b = spawn_api(h, port_b);
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  if (!wait_ready(port_a) || !wait_ready(port_b)) {
    stop(a, SIGKILL);
    stop(b, SIGKILL);
    FAIL() << "the API processes did not become ready";
  }
  const std::string body = batch_of(100000);
  const std::string target = "/ai/run/" + h.model() + "?queueRequest=true";
  const std::map<std::string, std::string> auth = {{"Authorization", "Bearer " + h.key_a()}};
  HttpResult killed_answer;
  std::thread client(
      [&] { killed_answer = testing::http_call("POST", port_a, target, body, auth); });
  // Kill A while its transaction streams the rows into Postgres.
  pqxx::connection watch(h.database_url());
  bool copying = false;
  for (int i = 0; i < 2000 && !copying; ++i) {
    pqxx::nontransaction tx(watch);
    copying = tx.exec1(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'COPY%requests%' "
                    "AND state = 'active'")[0]
                  .as<int>() > 0;
    if (!copying) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop(a, SIGKILL);
  client.join();
  EXPECT_TRUE(copying) << "the submit was not seen storing its rows";
  EXPECT_NE(killed_answer.status, 200) << "the killed process answered";
  // Postgres rolls the dead connection's transaction back.
  for (int i = 0; i < 100; ++i) {
    pqxx::nontransaction tx(watch);
    if (tx.exec1("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'COPY%requests%'")[0]
            .as<int>() == 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches"), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests"), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM outbox"), 0);
  // B counts none of it: 100,000 fit under 150,000, and 60,000 more do not.
  HttpResult accepted = testing::http_call("POST", port_b, target, body, auth);
  EXPECT_EQ(accepted.status, 200) << accepted.body.substr(0, 300);
  HttpResult over = testing::http_call("POST", port_b, target, batch_of(60000), auth);
  EXPECT_EQ(over.status, 429) << over.body.substr(0, 300);
  EXPECT_NE(over.body.find("max_enqueued_requests"), std::string::npos);
  EXPECT_NE(over.body.find("160000"), std::string::npos) << over.body.substr(0, 300);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests"), 100000);
  stop(b, SIGTERM);
}

}  // namespace
}  // namespace hr::api
