// Webhooks end to end over real Postgres, Redis and HTTP receivers on loopback: signed delivery of
// batch events (checked by the official Standard Webhooks library under node), retries through
// failures with the same webhook-id, Retry-After, 410 disabling an endpoint, manual replay, a
// dispatcher killed mid-delivery, the SSRF guard at submit and at delivery, and HTTPS with
// certificate and host name verification.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "base/hash.h"
#include "base/ids.h"
#include "base/secret_box.h"
#include "queue/dispatcher.h"
#include "queue/files.h"
#include "queue/lease.h"
#include "queue/webhooks.h"
#include "tests/testing/api_harness.h"
#include "tests/testing/process.h"
#include "tests/testing/webhook_receiver.h"
#include "webhooks/deliverer.h"
#include "webhooks/signature.h"

namespace hr::api {
namespace {

using webhooks::decide_outcome;
using webhooks::parse_ip;
using webhooks::parse_retry_after;
using webhooks::PostResult;

using nlohmann::json;
using testing::ApiHarness;
using testing::now_ms;
using testing::Received;
using testing::Receiver;

// A free loopback port with nothing listening on it (for connection-refused attempts).
uint16_t unused_port() {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::acceptor a(ioc, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

webhooks::DeliveryOptions fast_options() {
  webhooks::DeliveryOptions o;
  o.allow = {"loopback"};
  o.timeout_ms = 700;
  o.retry_schedule = "1s,1s,1s,1s,1s,1s";
  o.concurrency = 4;
  return o;
}

// Runs a webhooks::Deliverer on a thread for the lifetime of this object.
class BackgroundDispatcher {
 public:
  BackgroundDispatcher(const std::string& database_url, webhooks::DeliveryOptions o) {
    auto d = webhooks::Deliverer::create(database_url, std::move(o));
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    if (!d.is_ok()) return;
    d_ = std::move(d).value();
    thread_ = std::thread([this] { d_->run(stop_); });
  }
  ~BackgroundDispatcher() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::unique_ptr<webhooks::Deliverer> d_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

json reversal(const std::string& text) {
  return {{"messages", {{{"role", "user"}, {"content", "reverse: " + text}}}}, {"max_tokens", 40}};
}

// Submits a batch of `n` requests with the given webhook fields; returns its id.
std::string submit_with(ApiHarness& h, int n, const json& webhook_fields) {
  json body = webhook_fields;
  body["requests"] = json::array();
  for (int i = 0; i < n; ++i) body["requests"].push_back(reversal("x" + std::to_string(i)));
  auto r = h.post("/ai/run/" + h.model() + "?queueRequest=true", body.dump(), h.key_a());
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? r.json()["result"]["request_id"].get<std::string>() : "";
}

// Relays and completes every queued request of the harness model with a test consumer.
void complete_all(ApiHarness& h) {
  auto d = queue::Dispatcher::create(h.database_url(), h.redis_url(), {});
  ASSERT_TRUE(d.is_ok());
  ASSERT_TRUE((*d)->relay_once().is_ok());
  queue::LeaseOptions lo;
  lo.model = h.model();
  lo.owner = "test-consumer";
  auto c = queue::LeaseClient::create(h.database_url(), h.redis_url(), lo);
  ASSERT_TRUE(c.is_ok());
  for (;;) {
    auto leases = (*c)->pull(100, 200);
    ASSERT_TRUE(leases.is_ok());
    if (leases->empty()) break;
    std::vector<queue::Completion> done;
    for (const auto& l : *leases) done.push_back({l, R"({"response":"ok"})", 5, 2, 0});
    ASSERT_TRUE((*c)->complete(done).is_ok());
  }
}

json deliveries(ApiHarness& h, const std::string& query) {
  auto r = h.get("/v1/webhooks/deliveries" + query, h.key_a());
  EXPECT_EQ(r.status, 200) << r.body;
  return r.json()["result"]["data"];
}

// Verifies a received webhook with our signer against `secret` (any of the v1 signatures).
bool signature_matches(const Received& r, const std::string& secret) {
  std::string expected = webhooks::sign_webhook(
      {secret}, r.headers.at("webhook-id"), std::stoll(r.headers.at("webhook-timestamp")), r.body);
  return r.headers.at("webhook-signature").find(expected) != std::string::npos;
}

TEST(WebhookSignatureTest, MatchesTheStandardWebhooksVector) {
  // The reference vector of the Standard Webhooks libraries.
  EXPECT_EQ(
      webhooks::sign_webhook({"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
                             "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, R"({"test": 2432232314})"),
      "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
  std::string two = webhooks::sign_webhook(
      {queue::new_webhook_secret(), queue::new_webhook_secret()}, "id", 1, "{}");
  EXPECT_EQ(std::count(two.begin(), two.end(), ' '), 1);
  EXPECT_TRUE(queue::check_webhook_secret(queue::new_webhook_secret(), "s").is_ok());
  EXPECT_FALSE(queue::check_webhook_secret("whsec_c2hvcnQ=", "s").is_ok());
  EXPECT_FALSE(queue::check_webhook_secret("secret", "s").is_ok());
}

// A key sealing secrets at rest for the test: the suite's own (HEADROOM_SECRET_KEY_FILE, which
// processes the test starts read too) or, without one, a key of the test's own, forgotten after.
struct SealingKey {
  SealingKey() : own(!secrets::has_key()) {
    if (own) secrets::set_key(std::string(32, 's'));
  }
  ~SealingKey() {
    if (own) secrets::clear_key();
  }
  bool own;
};

// Every secret is stored sealed (the database holds no signing secret in the clear), and what is
// delivered is signed with the secrets the API showed.
TEST(WebhooksTest, CompletedBatchIsDeliveredOnceSignedToEveryTarget) {
  SealingKey key;
  Receiver batch_rx([](int) { return Receiver::Answer{}; });
  Receiver endpoint_rx([](int) { return Receiver::Answer{}; });
  ApiHarness h([](ApiConfig& c) { c.webhook_allow = {"loopback"}; });
  ASSERT_TRUE(h.ok() && batch_rx.ok() && endpoint_rx.ok());

  auto created = h.post("/v1/webhooks",
                        json{{"url", endpoint_rx.url("/ep")},
                             {"description", "ops"},
                             {"event_types", {"batch.completed"}}}
                            .dump(),
                        h.key_a());
  ASSERT_EQ(created.status, 201) << created.body;
  std::string endpoint_secret = created.json()["result"]["secret"];
  ASSERT_EQ(endpoint_secret.rfind("whsec_", 0), 0u);
  auto listed = h.get("/v1/webhooks", h.key_a());
  ASSERT_EQ(listed.json()["result"]["data"].size(), 1u);
  EXPECT_FALSE(listed.json()["result"]["data"][0].contains("secret"));  // shown once
  EXPECT_EQ(h.get("/v1/webhooks", h.key_b()).json()["result"]["data"].size(), 0u);
  auto signing = h.get("/v1/webhooks/signing-secret", h.key_a());
  ASSERT_EQ(signing.status, 200) << signing.body;
  std::string account_secret = signing.json()["result"]["secret"];
  const std::string own_secret = "whsec_" + base64_encode(std::string(32, 'o'));
  Receiver own_rx([](int) { return Receiver::Answer{}; });  // bob's batch's events go here
  json own = {{"webhook_url", own_rx.url()},
              {"webhook_secret", own_secret},
              {"requests", {reversal("own")}}};
  ASSERT_EQ(h.post("/ai/run/" + h.model() + "?queueRequest=true", own.dump(), h.key_b()).status,
            200);
  {
    pqxx::connection c(h.database_url());
    pqxx::nontransaction tx(c);
    for (const auto& [sql, plain] :
         {std::pair<std::string, std::string>{"SELECT secret FROM webhook_endpoints",
                                              endpoint_secret},
          {"SELECT secret FROM account_webhook_secrets", account_secret},
          {"SELECT webhook_secret FROM batches WHERE webhook_secret IS NOT NULL", own_secret}}) {
      const std::string stored = tx.exec1(sql)[0].as<std::string>();
      EXPECT_EQ(stored.rfind("hrenc1:", 0), 0u) << sql << ": " << stored;
      EXPECT_EQ(stored.find(plain.substr(6, 12)), std::string::npos) << sql;
      EXPECT_EQ(secrets::open(stored).value(), plain) << sql;
    }
  }

  std::string batch = submit_with(h, 3, {{"webhook_url", batch_rx.url()}});
  ASSERT_FALSE(batch.empty());
  BackgroundDispatcher dispatcher(h.database_url(), fast_options());
  ASSERT_TRUE(batch_rx.wait_for(1, 10000));  // batch.queued
  complete_all(h);
  ASSERT_TRUE(batch_rx.wait_for(2, 10000));
  ASSERT_TRUE(endpoint_rx.wait_for(1, 10000));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // nothing more may arrive

  auto per_batch = batch_rx.received();
  auto per_endpoint = endpoint_rx.received();
  ASSERT_EQ(per_batch.size(), 2u);
  ASSERT_EQ(per_endpoint.size(), 1u);
  json queued = json::parse(per_batch[0].body);
  json completed = json::parse(per_batch[1].body);
  EXPECT_EQ(queued["type"], "batch.queued");
  EXPECT_EQ(completed["type"], "batch.completed");
  EXPECT_EQ(completed["data"]["id"], batch);
  EXPECT_EQ(completed["data"]["status"], "completed");
  EXPECT_EQ(completed["data"]["request_counts"]["total"], 3);
  EXPECT_EQ(completed["data"]["request_counts"]["completed"], 3);
  EXPECT_EQ(completed["data"]["usage"]["prompt_tokens"], 15);
  EXPECT_EQ(completed["data"]["model"], h.model());
  EXPECT_TRUE(completed.contains("created_at"));
  EXPECT_EQ(per_batch[1].headers["webhook-id"], completed["id"]);
  EXPECT_NE(per_batch[1].headers["user-agent"].find("Headroom-Webhooks/"), std::string::npos);
  EXPECT_EQ(per_batch[1].headers["content-type"], "application/json");
  EXPECT_LE(std::abs(std::stoll(per_batch[1].headers["webhook-timestamp"]) - now_ms() / 1000), 60);
  EXPECT_TRUE(signature_matches(per_batch[0], account_secret));
  EXPECT_TRUE(signature_matches(per_batch[1], account_secret));
  EXPECT_FALSE(signature_matches(per_batch[1], endpoint_secret));
  // The endpoint got the same event (same webhook-id), signed with its own secret.
  json ep_event = json::parse(per_endpoint[0].body);
  EXPECT_EQ(ep_event["type"], "batch.completed");
  EXPECT_EQ(per_endpoint[0].headers["webhook-id"], per_batch[1].headers["webhook-id"]);
  EXPECT_TRUE(signature_matches(per_endpoint[0], endpoint_secret));

  json log = deliveries(h, "?batch_id=" + batch);
  ASSERT_EQ(log.size(), 3u);
  for (const auto& d : log) {
    EXPECT_EQ(d["status"], "delivered") << d.dump();
    EXPECT_EQ(d["attempts"], 1);
    EXPECT_EQ(d["attempt_log"][0]["status_code"], 200);
  }

  // The official library agrees, run by node.
  json cases = json::array();
  for (const auto& r : per_batch)
    cases.push_back({{"secret", account_secret}, {"headers", r.headers}, {"body", r.body}});
  cases.push_back({{"secret", endpoint_secret},
                   {"headers", per_endpoint[0].headers},
                   {"body", per_endpoint[0].body}});
  std::string file = ::testing::TempDir() + "webhook_cases_" + random_hex(4) + ".json";
  std::ofstream(file) << cases.dump();
  std::string prefix = HEADROOM_NODE_PREFIX;
  std::string install = std::string(HEADROOM_SOURCE_DIR) + "/tests/scripts/npm_prefix.sh " +
                        prefix + " standardwebhooks";
  ASSERT_EQ(std::system(install.c_str()), 0) << "npm install standardwebhooks failed";
  std::string verify = "node " + std::string(HEADROOM_SOURCE_DIR) +
                       "/tests/node/verify_webhooks.cjs " + prefix + " " + file;
  EXPECT_EQ(std::system(verify.c_str()), 0);
}

TEST(WebhooksTest, FailingReceiverGetsTheSameEventLaterAndRetryAfterIsHonoured) {
  uint16_t port = unused_port();
  ApiHarness h([](ApiConfig& c) { c.webhook_allow = {"loopback"}; });
  ASSERT_TRUE(h.ok());
  std::string url = "http://127.0.0.1:" + std::to_string(port) + "/hook";
  std::string batch =
      submit_with(h, 1, {{"webhook_url", url}, {"webhook_events", {"batch.queued"}}});
  ASSERT_FALSE(batch.empty());
  BackgroundDispatcher dispatcher(h.database_url(), fast_options());
  // Attempt 1: connection refused. Then the receiver comes up: 500, a timeout, 429 with
  // Retry-After: 3, then 200.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  Receiver rx(
      [](int n) {
        switch (n) {
          case 0:
            return Receiver::Answer{500};
          case 1:
            return Receiver::Answer{200, "", 2000};
          case 2:
            return Receiver::Answer{429, "3"};
          default:
            return Receiver::Answer{200};
        }
      },
      port);
  ASSERT_TRUE(rx.ok());
  ASSERT_TRUE(rx.wait_for(4, 30000));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto got = rx.received();
  ASSERT_EQ(got.size(), 4u);
  for (const auto& r : got) {
    EXPECT_EQ(r.headers.at("webhook-id"), got[0].headers.at("webhook-id"));
    EXPECT_EQ(r.body, got[0].body);
  }
  EXPECT_GE(got[3].at_ms - got[2].at_ms, 2900);  // Retry-After: 3 beat the 1 s schedule
  json log = deliveries(h, "?batch_id=" + batch);
  ASSERT_EQ(log.size(), 1u);
  const json& d = log[0];
  EXPECT_EQ(d["status"], "delivered");
  EXPECT_EQ(d["attempts"], 5);
  ASSERT_EQ(d["attempt_log"].size(), 5u);
  EXPECT_TRUE(d["attempt_log"][0]["status_code"].is_null());
  EXPECT_NE(d["attempt_log"][0]["error"].get<std::string>().find("connect"), std::string::npos);
  EXPECT_EQ(d["attempt_log"][1]["status_code"], 500);
  EXPECT_NE(d["attempt_log"][2]["error"].get<std::string>().find("no HTTP answer within 700 ms"),
            std::string::npos);
  EXPECT_EQ(d["attempt_log"][3]["status_code"], 429);
  EXPECT_EQ(d["attempt_log"][4]["status_code"], 200);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(d["attempt_log"][i]["outcome"], "retry");
  EXPECT_EQ(d["attempt_log"][4]["outcome"], "delivered");
}

TEST(WebhooksTest, GoneDisablesTheEndpointAndExhaustedRetriesFail) {
  std::atomic<int> mode{410};
  Receiver gone([&](int) { return Receiver::Answer{mode.load()}; });
  Receiver broken([](int) { return Receiver::Answer{500}; });
  ApiHarness h([](ApiConfig& c) { c.webhook_allow = {"loopback"}; });
  ASSERT_TRUE(h.ok() && gone.ok() && broken.ok());
  auto ep = h.post("/v1/webhooks", json{{"url", gone.url()}}.dump(), h.key_a());
  ASSERT_EQ(ep.status, 201);
  std::string ep_id = ep.json()["result"]["id"];
  webhooks::DeliveryOptions o = fast_options();
  o.retry_schedule = "1s";  // two attempts in all
  {
    BackgroundDispatcher dispatcher(h.database_url(), o);
    std::string batch = submit_with(h, 1, {{"webhook_url", broken.url()}});
    ASSERT_TRUE(broken.wait_for(2, 15000));
    ASSERT_TRUE(gone.wait_for(1, 15000));
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    EXPECT_EQ(broken.received().size(), 2u);
    EXPECT_EQ(gone.received().size(), 1u);
    json log = deliveries(h, "?batch_id=" + batch);
    ASSERT_EQ(log.size(), 2u);
    for (const auto& d : log) {
      EXPECT_EQ(d["status"], "failed") << d.dump();
      EXPECT_EQ(d["attempts"], d["endpoint_id"].is_null() ? 2 : 1) << d.dump();
    }
    auto e = h.get("/v1/webhooks/" + ep_id, h.key_a()).json()["result"];
    EXPECT_EQ(e["enabled"], false);
    EXPECT_NE(e["disabled_reason"].get<std::string>().find("410"), std::string::npos);
    json ep_log =
        h.get("/v1/webhooks/" + ep_id + "/deliveries", h.key_a()).json()["result"]["data"];
    ASSERT_EQ(ep_log.size(), 1u);
    std::string delivery = ep_log[0]["id"];

    // A disabled endpoint gets no new events, and cannot be replayed until enabled again.
    submit_with(h, 1, {});
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    EXPECT_EQ(gone.received().size(), 1u);
    auto refused = h.post("/v1/webhooks/deliveries/" + delivery + "/retry", "", h.key_a());
    EXPECT_EQ(refused.status, 409) << refused.body;
    mode = 200;
    auto patched = h.post("/v1/webhooks/" + ep_id, json{{"enabled", true}}.dump(), h.key_a(),
                          {{"X-HTTP-Method", "PATCH"}});
    EXPECT_EQ(patched.status, 404);  // POST is not PATCH
    auto enable = testing::http_call("PATCH", h.port(), "/v1/webhooks/" + ep_id,
                                     json{{"enabled", true}}.dump(),
                                     {{"Authorization", "Bearer " + h.key_a()}});
    ASSERT_EQ(enable.status, 200) << enable.body;
    EXPECT_TRUE(enable.json()["result"]["disabled_reason"].is_null());
    auto replay = h.post("/v1/webhooks/deliveries/" + delivery + "/retry", "", h.key_a());
    ASSERT_EQ(replay.status, 200) << replay.body;
    EXPECT_EQ(replay.json()["result"]["status"], "pending");
    EXPECT_EQ(h.post("/v1/webhooks/deliveries/" + delivery + "/retry", "", h.key_b()).status, 404);
    ASSERT_TRUE(gone.wait_for(2, 10000));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto after = h.get("/v1/webhooks/" + ep_id + "/deliveries", h.key_a()).json()["result"]["data"];
    bool replayed = false;
    for (const auto& d : after) {
      if (d["id"] == delivery) {
        replayed = d["status"] == "delivered" && d["attempts"] == 2;
        EXPECT_EQ(d["attempt_log"].size(), 2u);
      }
    }
    EXPECT_TRUE(replayed) << after.dump();
  }
}

TEST(WebhooksTest, EndpointAdminValidatesRotatesAndDeletes) {
  Receiver rx([](int) { return Receiver::Answer{}; });
  ApiHarness h([](ApiConfig& c) { c.webhook_allow = {"loopback"}; });
  ASSERT_TRUE(h.ok() && rx.ok());
  auto bad_type = h.post(
      "/v1/webhooks", json{{"url", rx.url()}, {"event_types", {"batch.done"}}}.dump(), h.key_a());
  EXPECT_EQ(bad_type.status, 400);
  EXPECT_EQ(bad_type.json()["errors"][0]["field"], "event_types");
  auto no_url = h.post("/v1/webhooks", json{{"description", "x"}}.dump(), h.key_a());
  EXPECT_EQ(no_url.json()["errors"][0]["field"], "url");
  auto ftp = h.post("/v1/webhooks", json{{"url", "ftp://example.com/x"}}.dump(), h.key_a());
  EXPECT_EQ(ftp.json()["errors"][0]["field"], "url");
  auto extra = h.post("/v1/webhooks", json{{"url", rx.url()}, {"secret", "x"}}.dump(), h.key_a());
  EXPECT_EQ(extra.json()["errors"][0]["field"], "secret");
  EXPECT_EQ(h.scalar("SELECT count(*) FROM webhook_endpoints"), 0);

  auto created = h.post("/v1/webhooks", json{{"url", rx.url()}}.dump(), h.key_a());
  ASSERT_EQ(created.status, 201);
  json e = created.json()["result"];
  EXPECT_EQ(e["event_types"].size(), 5u);  // every batch.* event by default
  std::string id = e["id"];
  std::string first = e["secret"];
  auto rotated = h.post("/v1/webhooks/" + id + "/rotate-secret",
                        json{{"grace_period_s", 3600}}.dump(), h.key_a());
  ASSERT_EQ(rotated.status, 200) << rotated.body;
  std::string second = rotated.json()["result"]["secret"];
  EXPECT_NE(first, second);
  EXPECT_FALSE(rotated.json()["result"]["previous_secret_expires_at"].is_null());
  EXPECT_EQ(h.post("/v1/webhooks/" + id + "/rotate-secret", "", h.key_b()).status, 404);

  // During the grace period both secrets sign: a receiver may verify with either.
  submit_with(h, 1, {});
  BackgroundDispatcher dispatcher(h.database_url(), fast_options());
  ASSERT_TRUE(rx.wait_for(1, 10000));
  Received r = rx.received()[0];
  EXPECT_EQ(
      std::count(r.headers["webhook-signature"].begin(), r.headers["webhook-signature"].end(), ' '),
      1);
  EXPECT_TRUE(signature_matches(r, first));
  EXPECT_TRUE(signature_matches(r, second));

  auto account = h.get("/v1/webhooks/signing-secret", h.key_a()).json()["result"]["secret"];
  auto account_rotated = h.post("/v1/webhooks/signing-secret/rotate", "", h.key_a());
  ASSERT_EQ(account_rotated.status, 200);
  EXPECT_NE(account_rotated.json()["result"]["secret"], account);
  EXPECT_NE(h.get("/v1/webhooks/signing-secret", h.key_b()).json()["result"]["secret"],
            account_rotated.json()["result"]["secret"]);

  EXPECT_EQ(testing::http_call("DELETE", h.port(), "/v1/webhooks/" + id, "",
                               {{"Authorization", "Bearer " + h.key_b()}})
                .status,
            404);
  EXPECT_EQ(testing::http_call("DELETE", h.port(), "/v1/webhooks/" + id, "",
                               {{"Authorization", "Bearer " + h.key_a()}})
                .status,
            200);
  EXPECT_EQ(h.get("/v1/webhooks/" + id, h.key_a()).status, 404);
}

// An account has at most 16 endpoints (409 past them, nothing written); another account is not
// held back, and deleting one makes room again.
TEST(WebhooksTest, EndpointsPerAccountAreCapped) {
  Receiver rx([](int) { return Receiver::Answer{}; });
  ApiHarness h([](ApiConfig& c) { c.webhook_allow = {"loopback"}; });
  ASSERT_TRUE(h.ok() && rx.ok());
  const std::string body = json{{"url", rx.url()}}.dump();
  std::string first;
  for (int i = 0; i < queue::kMaxWebhookEndpoints; ++i) {
    auto r = h.post("/v1/webhooks", body, h.key_a());
    ASSERT_EQ(r.status, 201) << i << " " << r.body;
    if (i == 0) first = r.json()["result"]["id"];
  }
  auto over = h.post("/v1/webhooks", body, h.key_a());
  EXPECT_EQ(over.status, 409) << over.body;
  EXPECT_NE(over.json()["errors"][0]["message"].get<std::string>().find("16 webhook endpoints"),
            std::string::npos)
      << over.body;
  EXPECT_EQ(h.scalar("SELECT count(*) FROM webhook_endpoints"), queue::kMaxWebhookEndpoints);
  EXPECT_EQ(h.post("/v1/webhooks", body, h.key_b()).status, 201);
  EXPECT_EQ(testing::http_call("DELETE", h.port(), "/v1/webhooks/" + first, "",
                               {{"Authorization", "Bearer " + h.key_a()}})
                .status,
            200);
  EXPECT_EQ(h.post("/v1/webhooks", body, h.key_a()).status, 201);
}

TEST(WebhooksTest, RequestEventsAreOptIn) {
  Receiver rx([](int) { return Receiver::Answer{}; });
  ApiHarness h([](ApiConfig& c) { c.webhook_allow = {"loopback"}; });
  ASSERT_TRUE(h.ok() && rx.ok());
  std::string plain = submit_with(
      h, 2, {{"webhook_url", rx.url("/plain")}, {"webhook_events", {"batch.completed"}}});
  std::string opted = submit_with(h, 3,
                                  {{"webhook_url", rx.url("/opted")},
                                   {"webhook_events", {"batch.completed", "request.completed"}}});
  BackgroundDispatcher dispatcher(h.database_url(), fast_options());
  complete_all(h);
  ASSERT_TRUE(rx.wait_for(5, 10000));  // 2 batch.completed + 3 request.completed
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  int requests = 0, batches = 0;
  for (const auto& r : rx.received()) {
    json ev = json::parse(r.body);
    if (ev["type"] == "request.completed") {
      ++requests;
      EXPECT_EQ(ev["data"]["batch_id"], opted);
      EXPECT_EQ(ev["data"]["status"], "completed");
    } else {
      EXPECT_EQ(ev["type"], "batch.completed");
      ++batches;
    }
  }
  EXPECT_EQ(requests, 3);
  EXPECT_EQ(batches, 2);
  (void)plain;
}

TEST(WebhooksTest, PrivateTargetsAreRefusedAtSubmitAndAtDelivery) {
  ApiHarness h;  // no allow-list: public targets only
  ASSERT_TRUE(h.ok());
  for (const std::string url :
       {"http://127.0.0.1:9/x", "http://10.0.0.1/x", "http://169.254.169.254/latest/meta-data",
        "http://[::1]:8080/x", "http://localhost:9/x", "http://[::ffff:127.0.0.1]/x",
        "http://192.168.1.10/x", "http://0.0.0.0/x", "https://user:pw@example.com/x",
        "ftp://example.com/x", "not a url"}) {
    json body = {{"webhook_url", url}, {"requests", {reversal("a")}}};
    auto r = h.post("/ai/run/" + h.model() + "?queueRequest=true", body.dump(), h.key_a());
    EXPECT_EQ(r.status, 400) << url << " " << r.body;
    EXPECT_EQ(r.json()["errors"][0]["field"], "webhook_url") << url;
    auto ep = h.post("/v1/webhooks", json{{"url", url}}.dump(), h.key_a());
    EXPECT_EQ(ep.status, 400) << url;
    EXPECT_EQ(ep.json()["errors"][0]["field"], "url") << url;
  }
  auto bad_events = h.post(
      "/ai/run/" + h.model() + "?queueRequest=true",
      json{{"webhook_events", {"batch.done"}}, {"requests", {reversal("a")}}}.dump(), h.key_a());
  EXPECT_EQ(bad_events.json()["errors"][0]["field"], "webhook_events");
  auto bad_secret = h.post("/ai/run/" + h.model() + "?queueRequest=true",
                           json{{"webhook_url", "https://93.184.216.34/h"},
                                {"webhook_secret", "hunter2"},
                                {"requests", {reversal("a")}}}
                               .dump(),
                           h.key_a());
  EXPECT_EQ(bad_secret.json()["errors"][0]["field"], "webhook_secret");
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches"), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM outbox"), 0);

  // A delivery to loopback (written when loopback was allowed) is refused by a dispatcher that
  // does not allow it: nothing is sent, the delivery fails at once.
  Receiver rx([](int) { return Receiver::Answer{}; });
  ASSERT_TRUE(rx.ok());
  {
    pqxx::connection c(h.database_url());
    pqxx::work tx(c);
    std::string account =
        tx.exec1("SELECT id::text FROM accounts WHERE name = 'alice'")[0].as<std::string>();
    for (const std::string& url :
         {rx.url(), "http://localhost:" + std::to_string(rx.port()) + "/h"}) {
      tx.exec_params(
          "INSERT INTO webhook_deliveries (event_id, event_type, account_id, url, payload, "
          "next_attempt_at) "
          "VALUES ($1, 'batch.completed', $2, $3, '{}', now())",
          new_uuid_v4().to_string(), account, url);
    }
    queue::ensure_signing_secret(tx, account);
    tx.commit();
  }
  webhooks::DeliveryOptions strict = fast_options();
  strict.allow = {};
  auto d = webhooks::Deliverer::create(h.database_url(), strict);
  ASSERT_TRUE(d.is_ok());
  auto n = (*d)->run_once();
  ASSERT_TRUE(n.is_ok()) << n.status().to_string();
  EXPECT_EQ(*n, 2);
  EXPECT_EQ(rx.received().size(), 0u);
  json log = deliveries(h, "");
  ASSERT_EQ(log.size(), 2u);
  for (const auto& del : log) {
    EXPECT_EQ(del["status"], "failed");
    EXPECT_NE(del["last_error"].get<std::string>().find("refused"), std::string::npos)
        << del.dump();
  }
}

// The product's own ports (Postgres, Redis, the API) are never webhook targets, even where
// loopback is allowed (serve's default): refused at submit and endpoint creation naming the field
// without saying which service it is, and refused at delivery with nothing sent; another loopback
// port is still a target.
TEST(WebhooksTest, TheProductsOwnPortsAreNeverTargets) {
  Receiver service([](int) { return Receiver::Answer{}; });  // stands in for Redis, say
  Receiver rx([](int) { return Receiver::Answer{}; });
  ASSERT_TRUE(service.ok() && rx.ok());
  const std::string own = "127.0.0.1:" + std::to_string(service.port());
  ApiHarness h([&](ApiConfig& c) {
    c.webhook_allow = {"loopback"};
    c.refused_webhook_services = {own};
  });
  ASSERT_TRUE(h.ok());
  for (const std::string& url :
       {service.url(), "http://localhost:" + std::to_string(service.port()) + "/x",
        "http://[::ffff:127.0.0.1]:" + std::to_string(service.port())}) {
    json body = {{"webhook_url", url}, {"requests", {reversal("a")}}};
    auto r = h.post("/ai/run/" + h.model() + "?queueRequest=true", body.dump(), h.key_a());
    EXPECT_EQ(r.status, 400) << url << " " << r.body;
    EXPECT_EQ(r.json()["errors"][0]["field"], "webhook_url") << url;
    EXPECT_NE(r.body.find("a port this service itself listens on"), std::string::npos) << r.body;
    auto ep = h.post("/v1/webhooks", json{{"url", url}}.dump(), h.key_a());
    EXPECT_EQ(ep.status, 400) << url << " " << ep.body;
  }
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches"), 0);
  EXPECT_FALSE(submit_with(h, 1, {{"webhook_url", rx.url()}}).empty()) << "another port";
  // A delivery to the service's port (written before it was refused) sends nothing.
  {
    pqxx::connection c(h.database_url());
    pqxx::work tx(c);
    std::string account =
        tx.exec1("SELECT id::text FROM accounts WHERE name = 'alice'")[0].as<std::string>();
    tx.exec_params(
        "INSERT INTO webhook_deliveries (event_id, event_type, account_id, url, payload, "
        "next_attempt_at) VALUES ($1, 'batch.completed', $2, $3, '{}', now())",
        new_uuid_v4().to_string(), account, service.url());
    queue::ensure_signing_secret(tx, account);
    tx.commit();
  }
  webhooks::DeliveryOptions options = fast_options();
  options.allow = {"loopback"};
  options.refused_services = {own};
  auto d = webhooks::Deliverer::create(h.database_url(), options);
  ASSERT_TRUE(d.is_ok());
  ASSERT_TRUE((*d)->run_once().is_ok());
  EXPECT_EQ(service.received().size(), 0u);
  json log = deliveries(h, "");
  bool refused = false;
  for (const auto& del : log) {
    if (del["url"] == service.url()) {
      EXPECT_EQ(del["status"], "failed");
      refused = del["last_error"].get<std::string>().find("refused") != std::string::npos;
    }
  }
  EXPECT_TRUE(refused) << log.dump();
}

// A batch that names a webhook has its host looked up before it is stored, which may take seconds
// (up to the 5 s deadline). Meanwhile the submit holds no database connection: with one for all of
// the API's handlers, other requests are answered while the lookup waits.
TEST(WebhooksTest, ASlowWebhookLookupHoldsNoDatabaseConnection) {
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool entered = false, open = false;
  };
  auto gate = std::make_shared<Gate>();  // the lookup's thread may outlive this test's frame
  ApiHarness h(
      [gate](api::ApiConfig& c) {
        c.db_connections = 1;
        c.db_wait_ms = 300;
        c.handler_threads = 8;
        c.webhook_lookup = [gate](const std::string&) -> Result<std::vector<webhooks::IpAddress>> {
          std::unique_lock<std::mutex> lock(gate->mu);
          gate->entered = true;
          gate->cv.notify_all();
          gate->cv.wait(lock, [&] { return gate->open; });
          return std::vector<webhooks::IpAddress>{parse_ip("93.184.216.34").value()};
        };
      },
      // The handlers alone: without the key check before the body, each request's handler
      // looks its new key up in the database, and so holds a connection before the lookup.
      [](http::HttpServerOptions& o) { o.check_header = nullptr; });
  ASSERT_TRUE(h.ok());
  auto open_gate = [gate] {
    std::lock_guard<std::mutex> lock(gate->mu);
    gate->open = true;
    gate->cv.notify_all();
  };
  struct Case {
    const char* what;
    std::string target;
    json body;
    int status;
  };
  std::string input_file;  // an OpenAI batch input of carol's
  {
    pqxx::connection conn(h.database_url());
    std::string carol = queue::create_api_key(conn, "carol").value().account_id;
    const std::string line =
        json{{"custom_id", "a"},
             {"method", "POST"},
             {"url", "/v1/chat/completions"},
             {"body", {{"model", h.model()}, {"messages", {{{"role", "user"}, {"content", "a"}}}}}}}
            .dump() +
        "\n";
    input_file =
        queue::create_file(conn, {carol, "batch", "in.jsonl", line, 1, std::nullopt}).value().id;
  }
  const std::vector<Case> cases = {
      {"a batch with a webhook_url",
       "/ai/run/" + h.model() + "?queueRequest=true",
       {{"webhook_url", "https://hooks.example.com/h"}, {"requests", {reversal("a")}}},
       200},
      {"a webhook endpoint", "/v1/webhooks", {{"url", "https://hooks.example.com/e"}}, 201},
      {"an OpenAI batch with a webhook_url",
       "/v1/batches",
       {{"input_file_id", input_file},
        {"endpoint", "/v1/chat/completions"},
        {"completion_window", "24h"},
        {"webhook_url", "https://hooks.example.com/o"}},
       200},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    {
      std::lock_guard<std::mutex> lock(gate->mu);
      gate->entered = gate->open = false;
    }
    // Keys not seen yet: each request looks its key up in the database first.
    std::vector<std::string> keys;
    {
      pqxx::connection conn(h.database_url());
      for (int i = 0; i < 2; ++i) keys.push_back(queue::create_api_key(conn, "carol").value().key);
    }
    testing::HttpResult posted;
    std::thread post([&] { posted = h.post(c.target, c.body.dump(), keys[0]); });
    bool entered = false;
    {
      std::unique_lock<std::mutex> lock(gate->mu);
      entered = gate->cv.wait_for(lock, std::chrono::seconds(10), [&] { return gate->entered; });
    }
    testing::HttpResult listed;
    if (entered) listed = h.get("/v1/async", keys[1]);
    open_gate();
    post.join();
    ASSERT_TRUE(entered);
    EXPECT_EQ(listed.status, 200) << listed.body;
    EXPECT_EQ(posted.status, c.status) << posted.body;
  }
  EXPECT_EQ(
      h.scalar("SELECT count(*) FROM batches WHERE webhook_url = 'https://hooks.example.com/h'"),
      1);
  EXPECT_EQ(
      h.scalar("SELECT count(*) FROM webhook_endpoints WHERE url = 'https://hooks.example.com/e'"),
      1);
  EXPECT_EQ(
      h.scalar("SELECT count(*) FROM batches WHERE webhook_url = 'https://hooks.example.com/o'"),
      1);
}

TEST(WebhooksTest, SeveralDispatchersNeverSendTheSameAttemptTwice) {
  Receiver rx([](int) { return Receiver::Answer{}; });
  ApiHarness h([](ApiConfig& c) { c.webhook_allow = {"loopback"}; });
  ASSERT_TRUE(h.ok() && rx.ok());
  auto ep = h.post("/v1/webhooks",
                   json{{"url", rx.url()}, {"event_types", {"batch.queued"}}}.dump(), h.key_a());
  ASSERT_EQ(ep.status, 201);
  {
    std::vector<std::unique_ptr<BackgroundDispatcher>> dispatchers;
    for (int i = 0; i < 3; ++i) {
      dispatchers.push_back(
          std::make_unique<BackgroundDispatcher>(h.database_url(), fast_options()));
    }
    for (int i = 0; i < 150; ++i) submit_with(h, 1, {});
    ASSERT_TRUE(rx.wait_for(150, 20000));
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  auto got = rx.received();
  std::set<std::string> ids;
  for (const auto& r : got) ids.insert(r.headers.at("webhook-id"));
  EXPECT_EQ(got.size(), 150u);
  EXPECT_EQ(ids.size(), 150u);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM webhook_attempts"), 150);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered' "
                     "AND attempts = 1"),
            150);
  // History past the retention is pruned: sent events and ended deliveries with their attempts.
  EXPECT_EQ(h.scalar("SELECT count(*) FROM outbox"), 150);
  submit_with(h, 1, {});  // an event not yet fanned out is kept
  pqxx::connection c(h.database_url());
  auto pruned = queue::prune_webhook_history(c, 0, 10000);
  ASSERT_TRUE(pruned.is_ok());
  EXPECT_EQ(*pruned, 300);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM outbox"), 1);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM webhook_deliveries"), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM webhook_attempts"), 0);
}

// --- a dispatcher process killed while a receiver holds its request ---

pid_t spawn_dispatcher(ApiHarness& h) {
  std::vector<std::string> args = {HEADROOM_BINARY,
                                   "--log-level",
                                   "warn",
                                   "dispatcher",
                                   "--database-url",
                                   h.database_url(),
                                   "--redis-url",
                                   h.redis_url(),
                                   "--webhook-allow",
                                   "loopback",
                                   "--webhook-timeout-ms",
                                   "2000",
                                   "--webhook-retry-schedule",
                                   "1s"};
  return testing::spawn(std::move(args));
}

TEST(WebhooksTest, DispatcherKilledMidDeliveryStillDelivers) {
  Receiver rx([](int n) { return n == 0 ? Receiver::Answer{200, "", 4000} : Receiver::Answer{}; });
  ApiHarness h([](ApiConfig& c) { c.webhook_allow = {"loopback"}; });
  ASSERT_TRUE(h.ok() && rx.ok());
  std::string batch =
      submit_with(h, 1, {{"webhook_url", rx.url()}, {"webhook_events", {"batch.queued"}}});
  pid_t first = spawn_dispatcher(h);
  ASSERT_TRUE(rx.wait_for(1, 15000));  // the first attempt is being held by the receiver
  kill(first, SIGKILL);
  waitpid(first, nullptr, 0);
  pid_t second = spawn_dispatcher(h);
  // The claim lapses (timeout 2 s + 5 s margin) and the second dispatcher sends it again.
  bool delivered = rx.wait_for(2, 30000);
  kill(second, SIGTERM);
  waitpid(second, nullptr, 0);
  ASSERT_TRUE(delivered);
  auto got = rx.received();
  EXPECT_EQ(got[0].headers["webhook-id"], got[1].headers["webhook-id"]);
  EXPECT_EQ(got[0].body, got[1].body);
  json log = deliveries(h, "?batch_id=" + batch);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0]["status"], "delivered");
  EXPECT_EQ(log[0]["attempts"], 2);
}

// --- HTTPS with a test CA ---

bool run_cmd(const std::string& cmd) {
  return std::system(("(" + cmd + ") >/dev/null 2>&1").c_str()) == 0;
}

// A CA and a server certificate for `name` (DNS) signed by it, in `dir`.
bool make_certs(const std::string& dir, const std::string& name) {
  std::ofstream(dir + "/ext.cnf") << "subjectAltName=DNS:" << name << "\n";
  return run_cmd("cd " + dir +
                 " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
                 "-subj /CN=headroom-test-ca"
                 " && openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
                 "-subj /CN=" +
                 name +
                 " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
                 "-out server.pem -days 2 -extfile ext.cnf");
}

// One-connection-at-a-time TLS receiver answering 200.
class TlsReceiver {
 public:
  explicit TlsReceiver(const std::string& dir)
      : tls_(boost::asio::ssl::context::tls_server),
        acceptor_(ioc_, {boost::asio::ip::make_address("127.0.0.1"), 0}) {
    tls_.use_certificate_chain_file(dir + "/server.pem");
    tls_.use_private_key_file(dir + "/server.key", boost::asio::ssl::context::pem);
    thread_ = std::thread([this] {
      namespace beast_http = boost::beast::http;
      while (!stop_) {
        boost::system::error_code ec;
        boost::asio::ip::tcp::socket sock(ioc_);
        acceptor_.accept(sock, ec);
        if (ec) continue;
        boost::asio::ssl::stream<boost::asio::ip::tcp::socket> s(std::move(sock), tls_);
        s.handshake(boost::asio::ssl::stream_base::server, ec);
        if (ec) continue;
        boost::beast::flat_buffer buf;
        beast_http::request<beast_http::string_body> req;
        beast_http::read(s, buf, req, ec);
        if (ec) continue;
        ++requests_;
        beast_http::response<beast_http::string_body> res{beast_http::status::ok, 11};
        res.body() = "{}";
        res.prepare_payload();
        beast_http::write(s, res, ec);
        s.shutdown(ec);
      }
    });
  }
  ~TlsReceiver() {
    stop_ = true;
    {
      boost::system::error_code ec;
      boost::asio::io_context ioc;
      boost::asio::ip::tcp::socket poke(ioc);
      poke.connect(acceptor_.local_endpoint(),
                   ec);  // wakes accept(); closing it ends the handshake
    }
    thread_.join();
  }
  int port() const { return acceptor_.local_endpoint().port(); }
  int requests() const { return requests_; }

 private:
  boost::asio::io_context ioc_;
  boost::asio::ssl::context tls_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
};

// A loopback service that accepts one connection at a time and, per connection, reads what comes
// and then either closes at once (as Postgres does with an HTTP request) or first writes `reply`
// (as Redis does: "-ERR ..."), on its own thread.
struct NotHttp {
  explicit NotHttp(std::string reply)
      : reply_(std::move(reply)), acceptor_(ioc_, {boost::asio::ip::make_address("127.0.0.1"), 0}) {
    thread_ = std::thread([this] {
      for (;;) {
        boost::asio::ip::tcp::socket s(ioc_);
        boost::system::error_code ec;
        acceptor_.accept(s, ec);
        if (ec || stop_) return;
        char buf[4096];
        s.read_some(boost::asio::buffer(buf), ec);
        if (!reply_.empty()) boost::asio::write(s, boost::asio::buffer(reply_), ec);
        s.close(ec);
      }
    });
  }
  ~NotHttp() {
    stop_ = true;
    boost::system::error_code ec;
    boost::asio::ip::tcp::socket poke(ioc_);
    poke.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
  }
  uint16_t port() const { return acceptor_.local_endpoint().port(); }
  std::string reply_;
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The delivery log is no port scanner: a closed port, a service that closes on an HTTP request
// and one that answers something that is not HTTP all read the same to the tenant (the cause goes
// to the operator's log); a timeout says so.
TEST(WebhookClientTest, FailuresBeforeAnHttpAnswerReadAlike) {
  NotHttp closes(""), garbles("-ERR unknown command 'POST'\r\n");
  webhooks::ClientOptions o;
  o.policy = webhooks::AddressPolicy::parse({"loopback"}).value();
  o.timeout_ms = 2000;
  webhooks::Client client(o);
  auto post = [&](uint16_t port) {
    return client.post("http://127.0.0.1:" + std::to_string(port) + "/h", {}, "{}");
  };
  const PostResult refused = post(unused_port()), closed = post(closes.port()),
                   garbled = post(garbles.port());
  for (const PostResult* r : {&refused, &closed, &garbled}) {
    EXPECT_EQ(r->status, 0);
    EXPECT_EQ(r->error, "no HTTP answer: the connection failed or was closed") << r->detail;
    EXPECT_FALSE(r->detail.empty());
  }
  EXPECT_NE(refused.detail, closed.detail) << "the operator still sees the cause";
}

TEST(WebhookClientTest, HttpsVerifiesTheChainAndTheHostName) {
  std::string dir = ::testing::TempDir() + "wh_tls_" + random_hex(4);
  ASSERT_TRUE(run_cmd("mkdir -p " + dir));
  ASSERT_TRUE(make_certs(dir, "localhost"));
  TlsReceiver rx(dir);
  webhooks::ClientOptions o;
  o.policy = webhooks::AddressPolicy::parse({"loopback"}).value();
  o.ca_file = dir + "/ca.pem";
  o.timeout_ms = 3000;
  webhooks::Client client(o);
  std::string port = std::to_string(rx.port());
  PostResult good = client.post("https://localhost:" + port + "/h", {{"webhook-id", "x"}}, "{}");
  EXPECT_EQ(good.status, 200) << good.error;
  // The certificate names localhost, not 127.0.0.1.
  PostResult wrong_name = client.post("https://127.0.0.1:" + port + "/h", {}, "{}");
  EXPECT_EQ(wrong_name.status, 0);
  EXPECT_NE(wrong_name.error.find("TLS handshake"), std::string::npos) << wrong_name.error;
  // Without the test CA the chain is not trusted.
  webhooks::ClientOptions no_ca = o;
  no_ca.ca_file.clear();
  webhooks::Client untrusting(no_ca);
  PostResult untrusted = untrusting.post("https://localhost:" + port + "/h", {}, "{}");
  EXPECT_EQ(untrusted.status, 0);
  EXPECT_NE(untrusted.error.find("TLS handshake"), std::string::npos) << untrusted.error;
  EXPECT_EQ(rx.requests(), 1);
}

TEST(WebhookClientTest, RetryAfterParsesSecondsAndDates) {
  EXPECT_EQ(parse_retry_after("120", 0), 120000);
  EXPECT_EQ(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412470000), 10000);
  EXPECT_EQ(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412490000), 0);
  EXPECT_FALSE(parse_retry_after("soon", 0).has_value());
  EXPECT_FALSE(parse_retry_after("", 0).has_value());
}

TEST(WebhookOutcomeTest, ScheduleRetryAfterGoneAndManual) {
  queue::ClaimedDelivery d;
  d.id = "d";
  d.attempt = 1;
  d.endpoint_id = "e";
  std::vector<int64_t> schedule = {5000, 300000};
  PostResult ok;
  ok.status = 204;
  EXPECT_EQ(decide_outcome(d, ok, schedule, 1.0).outcome, "delivered");
  PostResult redirect;
  redirect.status = 302;
  auto o = decide_outcome(d, redirect, schedule, 1.1);
  EXPECT_EQ(o.outcome, "retry");  // 3xx is a failure, not followed
  EXPECT_EQ(o.retry_in_ms, 5500);
  PostResult busy;
  busy.status = 503;
  busy.retry_after_ms = 42000;
  EXPECT_EQ(decide_outcome(d, busy, schedule, 1.0).retry_in_ms, 42000);
  busy.status = 500;  // Retry-After only counts on 429/502/503/504
  EXPECT_EQ(decide_outcome(d, busy, schedule, 1.0).retry_in_ms, 5000);
  PostResult gone;
  gone.status = 410;
  auto g = decide_outcome(d, gone, schedule, 1.0);
  EXPECT_EQ(g.outcome, "failed");
  EXPECT_EQ(g.disable_endpoint, "e");
  d.attempt = 3;  // the schedule is used up
  EXPECT_EQ(decide_outcome(d, redirect, schedule, 1.0).outcome, "failed");
  d.attempt = 1;
  d.manual = true;
  EXPECT_EQ(decide_outcome(d, redirect, schedule, 1.0).outcome, "failed");
  d.manual = false;
  PostResult refused;
  refused.refused = true;
  refused.error = "loopback";
  EXPECT_EQ(decide_outcome(d, refused, schedule, 1.0).outcome, "failed");
}

}  // namespace
}  // namespace hr::api
