// Account quotas over real HTTP and Postgres, through two API instances on one database: submits
// racing past max_enqueued_requests are refused whole with 429 naming the limit (Workers-AI and
// OpenAI shapes, and retries), nothing of them is written, and the room comes back as requests end;
// the same for max_enqueued_tokens.
#include <gtest/gtest.h>

#include <pqxx/pqxx>

#include <atomic>
#include <thread>
#include <vector>

#include "tests/testing/api_harness.h"

namespace hr::api {
namespace {

using nlohmann::json;
using testing::ApiHarness;
using testing::HttpResult;

json three_requests() {
  json reqs = json::array();
  for (int i = 0; i < 3; ++i) {
    reqs.push_back(
        {{"messages", {{{"role", "user"}, {"content", "reverse: q" + std::to_string(i)}}}},
         {"max_tokens", 8}});
  }
  return json{{"requests", reqs}};
}

HttpResult submit(ApiHarness& h, const std::string& key) {
  return h.post("/ai/run/" + h.model() + "?queueRequest=true", three_requests().dump(), key);
}

// Uploads `jsonl` as account a's batch file and makes a 24h batch of it: the creation's answer.
HttpResult create_openai_batch(ApiHarness& h, const std::string& jsonl) {
  const std::string boundary = "----hr-quota";
  const std::string form =
      "--" + boundary + "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--" +
      boundary +
      "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n" + jsonl +
      "\r\n--" + boundary + "--\r\n";
  HttpResult up = h.post("/v1/files", form, h.key_a(),
                         {{"Content-Type", "multipart/form-data; boundary=" + boundary}});
  EXPECT_EQ(up.status, 200) << up.body;
  return h.post("/v1/batches",
                json{{"input_file_id", up.json()["id"]},
                     {"endpoint", "/v1/chat/completions"},
                     {"completion_window", "24h"}}
                    .dump(),
                h.key_a());
}

TEST(QuotaTest, ConcurrentSubmitsThroughTwoApisNeverPassTheLimit) {
  ApiHarness one;
  ASSERT_TRUE(one.ok());
  ApiHarness two(one.database_url(), one.redis_url());  // a second API on the same store
  ASSERT_TRUE(two.ok());
  one.scalar(
      "WITH u AS (UPDATE accounts SET max_enqueued_requests = 10 WHERE name = 'alice' "
      "RETURNING 1) SELECT count(*) FROM u");
  std::atomic<int> accepted{0};
  std::atomic<int> refused{0};
  std::vector<std::thread> clients;
  std::vector<HttpResult> refusals(8);
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      ApiHarness& h = i % 2 == 0 ? one : two;
      HttpResult r = submit(h, h.key_a());
      if (r.status == 200) {
        ++accepted;
      } else {
        ++refused;
        refusals[i] = r;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(accepted.load(), 3) << "3 batches of 3 fit under 10";
  EXPECT_EQ(refused.load(), 5);
  for (const HttpResult& r : refusals) {
    if (r.status == 0) continue;
    EXPECT_EQ(r.status, 429) << r.body;
    EXPECT_EQ(r.json()["errors"][0]["field"], "max_enqueued_requests") << r.body;
    EXPECT_EQ(r.headers.count("Retry-After"), 1u);
  }
  // Nothing of a refused submit is written.
  EXPECT_EQ(one.scalar("SELECT count(*) FROM batches b JOIN accounts a ON a.id = b.account_id "
                       "WHERE a.name = 'alice'"),
            3);
  EXPECT_EQ(one.scalar("SELECT count(*) FROM requests"), 9);
  EXPECT_EQ(one.scalar("SELECT count(*) FROM outbox"), 3);

  // Another account is not limited.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(submit(two, two.key_b()).status, 200);

  // The OpenAI shape answers its own 429 naming the limit.
  std::string line =
      json{
          {"custom_id", "a"},
          {"method", "POST"},
          {"url", "/v1/chat/completions"},
          {"body",
           {{"model", one.model()}, {"messages", {{{"role", "user"}, {"content", "reverse: x"}}}}}}}
          .dump();
  std::string second = line;
  second.replace(second.find("\"a\""), 3, "\"b\"");
  HttpResult created = create_openai_batch(one, line + "\n" + second);
  EXPECT_EQ(created.status, 429) << created.body;
  EXPECT_EQ(created.json()["error"]["param"], "max_enqueued_requests") << created.body;
  EXPECT_EQ(created.json()["error"]["type"], "rate_limit_error") << created.body;

  // Requests that end make room again: cancel one batch (its three requests end).
  std::string first =
      one.get("/v1/async?limit=1", one.key_a()).json()["result"]["data"][0]["request_id"];
  ASSERT_EQ(one.post("/v1/async/" + first + "/cancel", "", one.key_a()).status, 200);
  EXPECT_EQ(submit(two, two.key_a()).status, 200);
  // And a retry counts like a submit: 9 enqueued again, 3 more would pass 10.
  HttpResult retried = one.post("/v1/async/" + first + "/retry", "", one.key_a());
  EXPECT_EQ(retried.status, 429) << retried.body;
  EXPECT_EQ(one.scalar("SELECT count(*) FROM batches WHERE retried_from IS NOT NULL"), 0);
}

// max_enqueued_tokens: each request holds its prompt's bytes / 4 and its max_tokens; three
// requests of "reverse: qN" (11 bytes, 3 tokens) and max_tokens 8 hold 33. Concurrent submits
// through two APIs never pass the limit together; a refused one writes nothing; the room comes
// back as requests end; a retry counts like a submit; the OpenAI shape names the limit too.
TEST(QuotaTest, EnqueuedTokensAreLimitedAcrossApis) {
  ApiHarness one;
  ASSERT_TRUE(one.ok());
  ApiHarness two(one.database_url(), one.redis_url());
  ASSERT_TRUE(two.ok());
  one.scalar(
      "WITH u AS (UPDATE accounts SET max_enqueued_tokens = 100 WHERE name = 'alice' "
      "RETURNING 1) SELECT count(*) FROM u");
  std::atomic<int> accepted{0};
  std::vector<HttpResult> answers(8);
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      ApiHarness& h = i % 2 == 0 ? one : two;
      answers[i] = submit(h, h.key_a());
      if (answers[i].status == 200) ++accepted;
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(accepted.load(), 3) << "3 batches of 33 tokens fit under 100";
  for (const HttpResult& r : answers) {
    if (r.status == 200) continue;
    EXPECT_EQ(r.status, 429) << r.body;
    EXPECT_EQ(r.json()["errors"][0]["field"], "max_enqueued_tokens") << r.body;
    EXPECT_NE(r.json()["errors"][0]["message"].get<std::string>().find("132"), std::string::npos)
        << r.body;
  }
  EXPECT_EQ(one.scalar("SELECT count(*) FROM requests"), 9);
  EXPECT_EQ(one.scalar("SELECT sum(enqueued_tokens) FROM batches"), 99);
  // One request asking for many tokens is refused alone.
  json big = {
      {"requests",
       {{{"messages", {{{"role", "user"}, {"content", "reverse: x"}}}}, {"max_tokens", 100}}}}};
  HttpResult refused =
      one.post("/ai/run/" + one.model() + "?queueRequest=true", big.dump(), one.key_a());
  EXPECT_EQ(refused.status, 429) << refused.body;
  // The OpenAI shape: 429 naming the limit.
  std::string line = json{
      {"custom_id", "a"},
      {"method", "POST"},
      {"url", "/v1/chat/completions"},
      {"body",
       {{"model", one.model()},
        {"messages", {{{"role", "user"}, {"content", "reverse: x"}}}},
        {"max_tokens",
         8}}}}.dump();
  HttpResult created = create_openai_batch(one, line);
  EXPECT_EQ(created.status, 429) << created.body;
  EXPECT_EQ(created.json()["error"]["param"], "max_enqueued_tokens") << created.body;
  EXPECT_EQ(one.scalar("SELECT count(*) FROM batches"), 3);
  // Cancelling a batch frees its 33; a retry of it takes them again, and then nothing more fits.
  std::string first =
      one.get("/v1/async?limit=1", one.key_a()).json()["result"]["data"][0]["request_id"];
  ASSERT_EQ(one.post("/v1/async/" + first + "/cancel", "", one.key_a()).status, 200);
  HttpResult retried = one.post("/v1/async/" + first + "/retry", "", one.key_a());
  EXPECT_EQ(retried.status, 200) << retried.body;
  EXPECT_EQ(one.scalar("SELECT enqueued_tokens FROM batches WHERE retried_from IS NOT NULL"), 33);
  EXPECT_EQ(submit(two, two.key_a()).status, 429);
}

}  // namespace
}  // namespace hr::api
