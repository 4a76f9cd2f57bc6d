// The test consumer.
#include "tests/testing/test_consumer.h"

#include <gtest/gtest.h>

namespace hr::testing {

using nlohmann::json;

const json Consumer::kStoredLogprobs = {
    {"content",
     {{{"token", "2"}, {"logprob", -0.25}, {"bytes", {50}}, {"top_logprobs", json::array()}}}},
    {"refusal", nullptr}};

Consumer::Consumer(ApiHarness& h, queue::DispatcherOptions options) {
  auto d = queue::Dispatcher::create(h.database_url(), h.redis_url(), std::move(options));
  EXPECT_TRUE(d.is_ok()) << d.status().to_string();
  if (d.is_ok()) dispatcher = std::move(d).value();
  auto l = queue::LeaseClient::create(h.database_url(), h.redis_url(),
                                      {h.model(), "test-consumer", 30000, 1});
  EXPECT_TRUE(l.is_ok()) << l.status().to_string();
  if (l.is_ok()) lease = std::move(l).value();
}

std::vector<queue::Lease> Consumer::pull(int n) {
  EXPECT_TRUE(dispatcher->relay_once().is_ok());
  auto r = lease->pull(n, 1000);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : std::vector<queue::Lease>{};
}

void Consumer::complete(const std::vector<queue::Lease>& leases) {
  std::vector<queue::Completion> done;
  for (const auto& l : leases) {
    const json body = json::parse(l.body);
    std::string text = body["messages"][0]["content"].get<std::string>().substr(9);
    json result = {{"response", std::string(text.rbegin(), text.rend())},
                   {"usage",
                    {{"prompt_tokens", 7},
                     {"completion_tokens", 3},
                     {"total_tokens", 10},
                     {"prompt_tokens_details", {{"cached_tokens", 0}}}}},
                   {"finish_reason", "stop"}};
    if (body.value("logprobs", false)) result["logprobs"] = kStoredLogprobs;
    done.push_back({l, result.dump(), 7, 3, 0});
  }
  auto r = lease->complete(done);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
}

void Consumer::fail(const std::vector<queue::Lease>& leases) {
  std::vector<queue::Failure> failed;
  for (const auto& l : leases) failed.push_back({l, "test_failure", "failed on purpose", false});
  auto r = lease->fail(failed);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
}

int Consumer::finalize() {
  auto r = dispatcher->finalize_openai_batches();
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : -1;
}

}  // namespace hr::testing
