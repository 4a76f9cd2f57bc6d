// The operator's view (GET /v1/operator/stats), the poll's status filter, and the pages served
// beside the API (/dashboard, /docs), over HTTP with real Postgres and Redis.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "api/sync_inference.h"
#include "base/clock.h"
#include "base/metrics.h"
#include "queue/accounts.h"
#include "queue/pg.h"
#include "queue/registry.h"
#include "tests/testing/api_harness.h"

namespace hr::api {
namespace {

using nlohmann::json;
using testing::ApiHarness;
using testing::HttpResult;

json requests(int n) {
  json out = json::array();
  for (int i = 0; i < n; ++i) out.push_back({{"prompt", "reverse: " + std::to_string(i)}});
  return out;
}

void make_operator(ApiHarness& h, const std::string& account, bool on) {
  auto conn = queue::pg_connect(h.database_url());
  ASSERT_TRUE(conn.is_ok());
  ASSERT_TRUE(queue::set_account_operator(**conn, account, on).is_ok());
}

// The last sample of the view, once one that `pred` accepts has been taken (or the last one).
json sample_when(ApiHarness& h, const std::function<bool(const json&)>& pred) {
  json last;
  for (int i = 0; i < 100; ++i) {
    HttpResult r = h.get("/v1/operator/stats", h.key_a());
    if (r.status != 200) return json();
    const json samples = r.json()["result"]["samples"];
    if (!samples.empty()) {
      last = samples.back();
      if (pred(last)) return last;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return last;
}

TEST(OperatorStatsTest, OnlyOperatorsSeeTheDeploymentsLoad) {
  ApiHarness h([](ApiConfig& c) { c.stats_interval_ms = 100; });
  ASSERT_TRUE(h.ok());
  HttpResult refused = h.get("/v1/operator/stats", h.key_a());
  EXPECT_EQ(refused.status, 403) << refused.body;
  EXPECT_EQ(refused.json()["errors"][0]["code"], 1003) << refused.body;
  EXPECT_EQ(h.get("/v1/operator/stats", "").status, 401);

  make_operator(h, "alice", true);
  HttpResult r = h.get("/v1/operator/stats", h.key_a());
  ASSERT_EQ(r.status, 200) << r.body;
  const json result = r.json()["result"];
  EXPECT_DOUBLE_EQ(result["interval_s"].get<double>(), 0.1);
  EXPECT_EQ(result["window_s"], 3600);
  EXPECT_EQ(result["models"], json::array({h.model()}));
  EXPECT_EQ(h.get("/v1/operator/stats", h.key_b()).status, 403);  // bob is not one

  make_operator(h, "alice", false);
  EXPECT_EQ(h.get("/v1/operator/stats", h.key_a()).status, 403);
}

// The sampling thread asks the sync side for its local workers while it is set, and never once
// set_sync_inference(nullptr) has returned (so that the sync side may go before the API).
TEST(OperatorStatsTest, TheSyncSideIsNotAskedOnceUnset) {
  struct Counting : SyncInference {
    Result<std::unique_ptr<wire::AnswerStream>> start_stream(const wire::ChatRequest&,
                                                             const SyncCall&) override {
      return unavailable("none");
    }
    Result<SyncAnswer> run(const wire::ChatRequest&, const SyncCall&) override {
      return unavailable("none");
    }
    std::vector<queue::WorkerInfo> local_workers() const override {
      ++asked;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // (an unset waits it out)
      return {};
    }
    mutable std::atomic<int> asked{0};
  };
  ApiHarness h([](ApiConfig& c) { c.stats_interval_ms = 20; });
  ASSERT_TRUE(h.ok());
  auto sync = std::make_unique<Counting>();
  h.api().set_sync_inference(sync.get());
  for (int i = 0; i < 200 && sync->asked.load() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GE(sync->asked.load(), 3);
  h.api().set_sync_inference(nullptr);
  const int asked = sync->asked.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // ten intervals
  EXPECT_EQ(sync->asked.load(), asked);
  sync.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

TEST(OperatorStatsTest, SamplesAnnouncedWorkersAndTheQueue) {
  ApiHarness h([](ApiConfig& c) { c.stats_interval_ms = 100; });
  ASSERT_TRUE(h.ok());
  make_operator(h, "alice", true);
  ASSERT_EQ(h.post("/ai/run/" + h.model() + "?queueRequest=true",
                   json({{"requests", requests(7)}}).dump(), h.key_b())
                .status,
            200);
  json queued = sample_when(h, [&](const json& s) { return s["queued"].contains(h.model()); });
  ASSERT_TRUE(queued.is_object());
  EXPECT_EQ(queued["queued"][h.model()], 7) << queued;
  EXPECT_EQ(queued["workers"], 0);

  // A worker announces itself twice, a second apart by its clock, with its totals.
  auto registry = queue::WorkerRegistry::connect(h.redis_url());
  ASSERT_TRUE(registry.is_ok());
  queue::WorkerInfo w;
  w.id = "w1";
  w.model = h.model();
  w.url = "http://127.0.0.1:1";
  w.capacity = 8;
  w.async_running = 2;
  w.total_kv_blocks = 100;
  w.free_kv_blocks = 60;
  w.utilization = 0.5;
  w.heartbeat_ms = SystemClock::instance().now_unix_ms();
  w.totals.started_ms = 1;
  w.totals.sync_ttft.assign(metrics::latency_buckets().size(), 0);
  ASSERT_TRUE((*registry)->announce(w, 60000).is_ok());
  ASSERT_TRUE(sample_when(h, [](const json& s) { return s["workers"] == 1; }).is_object());
  w.heartbeat_ms += 1000;
  w.totals.sync_tokens = 40;
  w.totals.async_tokens = 300;
  w.totals.credits_granted = 12;
  for (uint64_t& c : w.totals.sync_ttft) c = 5;  // five first tokens, all within the first bucket
  ASSERT_TRUE((*registry)->announce(w, 60000).is_ok());
  json s = sample_when(h, [](const json& s) { return s["async_tokens_per_s"] == 300.0; });
  EXPECT_DOUBLE_EQ(s["sync_tokens_per_s"].get<double>(), 40) << s;
  EXPECT_DOUBLE_EQ(s["async_tokens_per_s"].get<double>(), 300) << s;
  EXPECT_DOUBLE_EQ(s["credits_per_s"].get<double>(), 12) << s;
  ASSERT_TRUE(s["sync_ttft_p50_ms"].is_number()) << s;
  EXPECT_LE(s["sync_ttft_p99_ms"].get<double>(), metrics::latency_buckets()[0] * 1000) << s;
  EXPECT_EQ(s["running"][h.model()], 2) << s;
  EXPECT_EQ(s["queued"][h.model()], 5) << s;
  EXPECT_DOUBLE_EQ(s["kv_used"].get<double>(), 0.4) << s;
  HttpResult view = h.get("/v1/operator/stats", h.key_a());
  const json workers = view.json()["result"]["workers"];
  ASSERT_EQ(workers.size(), 1u) << view.body;
  EXPECT_EQ(workers[0]["id"], "w1");
  EXPECT_EQ(workers[0]["kv_used_blocks"], 40);
  EXPECT_DOUBLE_EQ(workers[0]["credits_per_s"].get<double>(), 12);
  ASSERT_TRUE((*registry)->withdraw(h.model(), "w1").is_ok());
}

TEST(PollStatusFilterTest, OnlyTheRequestsInTheNamedStatuses) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  std::string id = h.submit(requests(5), h.key_a());
  ASSERT_FALSE(id.empty());
  // Two requests ended as failed (no workers here: the others stay queued).
  EXPECT_EQ(h.scalar("WITH u AS (UPDATE requests SET status = 'failed', error = "
                     "'{\"code\":\"engine_error\",\"message\":\"boom\"}' WHERE batch_id = '" +
                     id + "' AND idx IN (1, 3) RETURNING 1) SELECT count(*) FROM u"),
            2);
  HttpResult failed = h.get("/v1/async/" + id + "?include=partial&status=failed", h.key_a());
  ASSERT_EQ(failed.status, 200) << failed.body;
  const json responses = failed.json()["result"]["responses"];
  ASSERT_EQ(responses.size(), 2u) << failed.body;
  EXPECT_EQ(responses[0]["id"], 1) << failed.body;
  EXPECT_EQ(responses[1]["id"], 3) << failed.body;
  HttpResult two = h.get("/v1/async/" + id + "?include=partial&status=failed,queued", h.key_a());
  EXPECT_EQ(two.json()["result"]["responses"].size(), 5u) << two.body;
  HttpResult paged =
      h.get("/v1/async/" + id + "?include=partial&status=queued&from=1&limit=2", h.key_a());
  ASSERT_EQ(paged.json()["result"]["responses"].size(), 2u) << paged.body;
  EXPECT_EQ(paged.json()["result"]["responses"][0]["id"], 2) << paged.body;
  EXPECT_EQ(paged.json()["result"]["responses"][1]["id"], 4) << paged.body;
  for (const char* bad : {"bogus", "failed,", ""}) {
    HttpResult r =
        h.get("/v1/async/" + id + "?include=partial&status=" + std::string(bad), h.key_a());
    EXPECT_EQ(r.status, 400) << bad << " " << r.body;
    EXPECT_EQ(r.json()["errors"][0]["field"], "status") << r.body;
  }
}

TEST(PagesTest, ServedWithoutAKeyWithTheirPolicy) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  for (const auto& [path, type] : std::vector<std::pair<std::string, std::string>>{
           {"/dashboard", "text/html"},
           {"/dashboard/app.js", "text/javascript"},
           {"/dashboard/app.css", "text/css"},
           {"/dashboard/uplot.js", "text/javascript"},
           {"/docs", "text/html"},
           {"/docs/docs.js", "text/javascript"},
           {"/docs/swagger-ui-bundle.js", "text/javascript"},
           {"/docs/swagger-ui.css", "text/css"}}) {
    HttpResult r = h.get(path, "");
    SCOPED_TRACE(path);
    ASSERT_EQ(r.status, 200) << r.body.substr(0, 200);
    EXPECT_EQ(r.headers["Content-Type"].rfind(type, 0), 0u) << r.headers["Content-Type"];
    EXPECT_NE(r.headers["Content-Security-Policy"].find("default-src 'self'"), std::string::npos);
    EXPECT_EQ(r.headers["X-Content-Type-Options"], "nosniff");
    EXPECT_FALSE(r.body.empty());
  }
  EXPECT_NE(h.get("/dashboard", "").body.find("app.js"), std::string::npos);
  HttpResult missing = h.get("/dashboard/nothing.js", "");
  EXPECT_EQ(missing.status, 404) << missing.body;
  EXPECT_EQ(h.post("/dashboard", "{}", "").status, 404);
  // HEAD: GET's header (the length of the body it would send), no body.
  HttpResult head = h.call("HEAD", "/dashboard/uplot.js", "", "", {});
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.headers["Content-Length"],
            std::to_string(h.get("/dashboard/uplot.js", "").body.size()));
  EXPECT_TRUE(head.body.empty());
  EXPECT_EQ(h.get("/dashboards", "").status, 401);  // not a page: a key is asked for
}

}  // namespace
}  // namespace hr::api
