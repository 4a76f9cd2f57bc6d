// Large answers over real HTTP and Postgres: the results of a 100,000-request batch go out a page
// at a time, so ten clients polling it at once keep the API's memory bounded; and an account may
// have only so many such answers in flight (429 past them, room again once one ends).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <pqxx/pqxx>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/api_harness.h"

namespace hr::api {
namespace {

using nlohmann::json;
using testing::ApiHarness;

// Submits `n` one-message requests and marks them all completed with answers of about
// `answer_bytes` each; returns the batch's request_id.
std::string completed_batch(ApiHarness& h, int n, int answer_bytes) {
  json reqs = json::array();
  for (int i = 0; i < n; ++i) {
    reqs.push_back({{"messages", {{{"role", "user"}, {"content", "q" + std::to_string(i)}}}},
                    {"max_tokens", 8},
                    {"external_reference", "r" + std::to_string(i)}});
  }
  const std::string id = h.submit(reqs, h.key_a());
  if (id.empty()) return id;
  const std::string text(answer_bytes, 'x');
  pqxx::connection c(h.database_url());
  pqxx::work tx(c);
  tx.exec_params(
      "UPDATE requests SET status = 'completed', finished_at = now(), prompt_tokens = 3, "
      "completion_tokens = 8, result = json_build_object('v', 1, 'text', $2::text || idx, "
      "'finish_reason', 'stop', 'usage', json_build_object('prompt_tokens', 3, "
      "'completion_tokens', 8, 'cached_tokens', 0))::text WHERE batch_id = $1::uuid",
      id, text);
  tx.exec_params(
      "UPDATE batches SET status = 'completed', num_completed = num_total, finished_at = now() "
      "WHERE id = $1::uuid",
      id);
  tx.commit();
  return id;
}

int64_t rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// A GET read to its end and thrown away as it comes: the bytes received and the last few.
struct Drained {
  int64_t bytes = 0;
  std::string tail;
};

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_get(int fd, const std::string& target, const std::string& key) {
  const std::string req = "GET " + target + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key +
                          "\r\nConnection: close\r\n\r\n";
  EXPECT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
}

Drained drain_get(int port, const std::string& target, const std::string& key) {
  Drained d;
  int fd = connect_to(port);
  if (fd < 0) return d;
  send_get(fd, target, key);
  std::vector<char> buf(64 << 10);
  for (ssize_t n; (n = ::recv(fd, buf.data(), buf.size(), 0)) > 0;) {
    d.bytes += n;
    d.tail.append(buf.data(), static_cast<size_t>(n));
    if (d.tail.size() > 256) d.tail.erase(0, d.tail.size() - 256);
  }
  ::close(fd);
  return d;
}

// Ten clients poll a completed batch of 100,000 requests (about 60 MB of JSON each) at once: the
// API's resident memory grows by less than 300 MB while they read (built whole, each poll took
// about 115 MB), every poll gets the whole answer, and the answer holds every response in input
// order.
TEST(LargeAnswersTest, TenPollsOfAHundredThousandRequestsKeepMemoryBounded) {
  ApiHarness h([](ApiConfig& c) { c.max_large_answers_per_account = 16; });
  ASSERT_TRUE(h.ok());
  const std::string id = completed_batch(h, 100000, 500);
  ASSERT_FALSE(id.empty());
  const std::string target = "/v1/async/" + id;
  const int64_t base = rss_bytes();
  std::atomic<bool> done{false};
  std::atomic<int64_t> peak{base};
  std::thread sampler([&] {
    while (!done) {
      peak = std::max<int64_t>(peak, rss_bytes());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::vector<Drained> polls(10);
  std::vector<std::thread> clients;
  for (auto& p : polls) clients.emplace_back([&] { p = drain_get(h.port(), target, h.key_a()); });
  for (auto& c : clients) c.join();
  done = true;
  sampler.join();
  for (const Drained& p : polls) {
    EXPECT_GT(p.bytes, 50'000'000);
    EXPECT_NE(p.tail.find("x99999\""), std::string::npos) << p.tail;
    EXPECT_NE(p.tail.find("]},\"success\":true}\r\n0\r\n\r\n"), std::string::npos) << p.tail;
  }
  std::cout << "rss base " << (base >> 20) << " MiB, peak during the polls " << (peak >> 20)
            << " MiB\n";
  EXPECT_LT(peak - base, 300ll << 20)
      << "base " << (base >> 20) << " MiB, peak " << (peak >> 20) << " MiB";
  // The answer itself: every response once, in input order, with its result.
  const json body = h.get(target, h.key_a()).json();
  ASSERT_TRUE(body.is_object());
  const json& responses = body["result"]["responses"];
  ASSERT_EQ(responses.size(), 100000u);
  for (int i : {0, 1, 499, 500, 501, 99999}) {
    EXPECT_EQ(responses[i]["id"], i);
    EXPECT_EQ(responses[i]["external_reference"], "r" + std::to_string(i));
    EXPECT_EQ(responses[i]["result"]["response"], std::string(500, 'x') + std::to_string(i));
  }
  EXPECT_EQ(body["result"]["status"], "completed");
  EXPECT_EQ(body["result"]["progress"]["completed"], 100000);
  EXPECT_EQ(body["result"]["usage"]["completion_tokens"].get<int>(), 0)
      << "the batch's counters, which this test did not set";
}

// With one large answer allowed per account, a client that does not read its poll holds the slot:
// a second large poll by the account gets 429 with Retry-After naming the limit, while a small
// poll is answered; once the first client goes, the large poll is answered again.
TEST(LargeAnswersTest, AnAccountHasOnlySoManyLargeAnswersInFlight) {
  ApiHarness h([](ApiConfig& c) { c.max_large_answers_per_account = 1; });
  ASSERT_TRUE(h.ok());
  const std::string big = completed_batch(h, 20000, 1500);  // ~32 MB: more than socket buffers
  const std::string small = completed_batch(h, 10, 10);
  ASSERT_FALSE(big.empty());
  ASSERT_FALSE(small.empty());
  int stalled = connect_to(h.port());
  ASSERT_GE(stalled, 0);
  send_get(stalled, "/v1/async/" + big, h.key_a());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // its first pages are sent
  testing::HttpResult second = h.get("/v1/async/" + big, h.key_a());
  EXPECT_EQ(second.status, 429) << second.body;
  EXPECT_EQ(second.headers.count("Retry-After"), 1u);
  EXPECT_NE(second.body.find("large results"), std::string::npos) << second.body;
  EXPECT_EQ(h.get("/v1/async/" + small, h.key_a()).status, 200);
  ::close(stalled);
  int status = 0;
  for (int i = 0; i < 50 && status != 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    status = drain_get(h.port(), "/v1/async/" + big, h.key_a()).tail.find("0\r\n\r\n") !=
                     std::string::npos
                 ? 200
                 : 0;
  }
  EXPECT_EQ(status, 200) << "the slot was not given back";
}

// The results so far of a running OpenAI batch larger than a page go out a page at a time
// (chunked), each line once and in input order: succeeded ones on /output, the rest on /errors.
TEST(LargeAnswersTest, ResultsSoFarOfALargeOpenAiBatchArePaged) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  const int n = 1201;
  std::string lines;
  for (int i = 0; i < n; ++i) {
    lines += json{{"custom_id", "c" + std::to_string(i)},
                  {"method", "POST"},
                  {"url", "/v1/chat/completions"},
                  {"body",
                   {{"model", h.model()},
                    {"messages", {{{"role", "user"}, {"content", "q"}}}},
                    {"max_tokens", 8}}}}
                 .dump() +
             "\n";
  }
  const std::string boundary = "hr-large-answers";
  const std::string form =
      "--" + boundary + "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--" +
      boundary +
      "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n" + lines +
      "\r\n--" + boundary + "--\r\n";
  testing::HttpResult file =
      h.post("/v1/files", form, h.key_a(),
             {{"Content-Type", "multipart/form-data; boundary=" + boundary}});
  ASSERT_EQ(file.status, 200) << file.body;
  testing::HttpResult batch = h.post("/v1/batches",
                                     json{{"input_file_id", file.json()["id"]},
                                          {"endpoint", "/v1/chat/completions"},
                                          {"completion_window", "24h"}}
                                         .dump(),
                                     h.key_a());
  ASSERT_EQ(batch.status, 200) << batch.body;
  const std::string id = batch.json()["id"];
  // Even requests completed, odd ones failed; the batch still runs.
  h.scalar(
      "WITH u AS (UPDATE requests SET status = CASE WHEN idx % 2 = 0 THEN 'completed' ELSE "
      "'failed' END, finished_at = now(), result = CASE WHEN idx % 2 = 0 THEN '{\"v\": 1, "
      "\"text\": \"ok\", \"finish_reason\": \"stop\", \"usage\": {\"prompt_tokens\": 1, "
      "\"completion_tokens\": 1, \"cached_tokens\": 0}}' END, error = CASE WHEN idx % 2 = 1 THEN "
      "'{\"code\": \"model_error\", \"message\": \"boom\"}' END WHERE batch_id = '" +
      id + "'::uuid RETURNING 1) SELECT count(*) FROM u");
  for (const bool succeeded : {true, false}) {
    testing::HttpResult r =
        h.get("/v1/batches/" + id + (succeeded ? "/output" : "/errors"), h.key_a());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.headers["Transfer-Encoding"], "chunked") << "sent a page at a time";
    EXPECT_EQ(r.headers["x-batch-status"], "in_progress");
    std::vector<std::string> ids;
    for (size_t p = 0; p < r.body.size();) {
      const size_t end = r.body.find('\n', p);
      ids.push_back(json::parse(r.body.substr(p, end - p))["custom_id"]);
      p = end + 1;
    }
    ASSERT_EQ(ids.size(), succeeded ? 601u : 600u);
    for (size_t k = 0; k < ids.size(); ++k) {
      ASSERT_EQ(ids[k], "c" + std::to_string(2 * k + (succeeded ? 0 : 1)));
    }
  }
}

}  // namespace
}  // namespace hr::api
