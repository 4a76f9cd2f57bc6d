// A Workers-AI batch's priority over real HTTP and Postgres: in the body or its options, shown on
// every poll and list, the account's default when none is named; a bad one refused naming its
// field, with nothing written.
#include <gtest/gtest.h>

#include "tests/testing/api_harness.h"

namespace hr::api {
namespace {

using nlohmann::json;
using testing::ApiHarness;
using testing::HttpResult;

HttpResult submit(ApiHarness& h, const json& extra) {
  json body = {
      {"requests",
       {{{"messages", {{{"role", "user"}, {"content", "reverse: abc"}}}}, {"max_tokens", 8}}}}};
  body.update(extra);
  return h.post("/ai/run/" + h.model() + "?queueRequest=true", body.dump(), h.key_a());
}

int priority_of(ApiHarness& h, const HttpResult& submitted) {
  EXPECT_EQ(submitted.status, 200) << submitted.body;
  std::string id = submitted.json()["result"]["request_id"];
  return h.get("/v1/async/" + id, h.key_a()).json()["result"]["priority"];
}

TEST(PriorityTest, NamedInTheBodyOrItsOptionsElseTheAccountsDefault) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(priority_of(h, submit(h, json::object())), 0);
  EXPECT_EQ(priority_of(h, submit(h, {{"priority", 9}})), 9);
  EXPECT_EQ(priority_of(h, submit(h, {{"options", {{"priority", -2}}}})), -2);
  h.scalar(
      "WITH u AS (UPDATE accounts SET default_priority = 3 WHERE name = 'alice' "
      "RETURNING 1) SELECT count(*) FROM u");
  EXPECT_EQ(priority_of(h, submit(h, json::object())), 3);
  HttpResult list = h.get("/v1/async?limit=1", h.key_a());
  ASSERT_EQ(list.status, 200) << list.body;
  EXPECT_EQ(list.json()["result"]["data"][0]["priority"], 3) << list.body;
}

TEST(PriorityTest, ABadPriorityIsRefusedNamingItsField) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  const int64_t before = h.scalar("SELECT count(*) FROM batches");
  for (const auto& [extra, field] : std::vector<std::pair<json, std::string>>{
           {{{"priority", 101}}, "priority"},
           {{{"priority", "high"}}, "priority"},
           {{{"priority", 1.5}}, "priority"},
           {{{"options", {{"priority", -101}}}}, "options.priority"}}) {
    HttpResult r = submit(h, extra);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.json()["errors"][0]["field"], field) << r.body;
  }
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches"), before);
}

}  // namespace
}  // namespace hr::api
