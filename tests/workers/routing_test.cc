// Sync requests through the API to separate `headroom worker` processes found in the Redis
// registry: answers (plain and streamed, both API shapes), session affinity, spreading without
// it, failover when a worker is killed, withdrawal on SIGTERM, and 429 code 3040 with Retry-After
// when no worker has room.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <map>
#include <set>
#include <thread>

#include "api/worker_router.h"
#include "queue/registry.h"
#include "tests/testing/api_harness.h"
#include "tests/testing/process.h"

namespace hr::workers {
namespace {

using nlohmann::json;

// Prompts whose reversal the bundled model gets right.
const std::vector<std::pair<std::string, std::string>> kCases = {
    {"hello world", "dlrow olleh"}, {"flex batch", "hctab xelf"}, {"stream", "maerts"}};

class Routing : public ::testing::Test {
 protected:
  void SetUp() override {
    h_ = std::make_unique<testing::ApiHarness>(
        [](api::ApiConfig& c) { c.sync_queue_timeout_ms = 400; });
    ASSERT_TRUE(h_->ok());
    api::RouterOptions o;
    o.redis_url = h_->redis_url();
    o.refresh_ms = 50;
    router_ = std::make_unique<api::WorkerRouter>(o);
    h_->api().set_sync_inference(router_.get());
    auto r = queue::WorkerRegistry::connect(h_->redis_url());
    ASSERT_TRUE(r.is_ok());
    registry_ = std::move(r).value();
  }
  void TearDown() override {
    for (auto& [name, pid] : workers_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (h_) h_->api().set_sync_inference(nullptr);
  }

  void start_worker(const std::string& name) {
    std::string model_dir = std::string(HEADROOM_SOURCE_DIR) + "/models/tiny-reverse";
    workers_[name] = testing::spawn(
        {HEADROOM_BINARY, "--log-level", "warn", "worker", "--model", model_dir, "--name",
         h_->model(), "--worker-name", name, "--database-url", h_->database_url(), "--redis-url",
         h_->redis_url(), "--sync-port", "0", "--heartbeat-ms", "200", "--drain-seconds", "2"});
  }
  // Waits until exactly the workers in `names` are announced.
  bool wait_live(std::set<std::string> names) {
    for (int i = 0; i < 300; ++i) {
      auto live = registry_->live(h_->model());
      std::set<std::string> ids;
      if (live.is_ok()) {
        for (const auto& w : *live) ids.insert(w.id);
      }
      if (ids == names) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  void stop_worker(const std::string& name, int sig) {
    kill(workers_[name], sig);
    waitpid(workers_[name], nullptr, 0);
    workers_.erase(name);
  }
  testing::HttpResult chat(const std::string& text, const std::string& affinity = "",
                           bool reject_if_busy = false) {
    json body = {{"model", h_->model()},
                 {"messages", {{{"role", "user"}, {"content", "reverse: " + text}}}},
                 {"temperature", 0}};
    if (reject_if_busy) body["options"] = {{"rejectIfBusy", true}};
    std::map<std::string, std::string> headers;
    if (!affinity.empty()) headers["x-session-affinity"] = affinity;
    return h_->post("/v1/chat/completions", body.dump(), h_->key_a(), headers);
  }

  std::unique_ptr<testing::ApiHarness> h_;
  std::unique_ptr<api::WorkerRouter> router_;
  std::unique_ptr<queue::WorkerRegistry> registry_;
  std::map<std::string, pid_t> workers_;
};

TEST_F(Routing, AnswersComeFromRemoteWorkersInEveryShape) {
  start_worker("w1");
  ASSERT_TRUE(wait_live({"w1"}));
  for (const auto& [text, reversed] : kCases) {
    auto r = chat(text);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.headers["x-headroom-worker"], "w1");
    json j = r.json();
    EXPECT_EQ(j["choices"][0]["message"]["content"], reversed);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
    EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 0);
  }
  // Workers AI shape, plain and streamed.
  auto cf = h_->post("/ai/run/" + h_->model(),
                     json{{"prompt", "reverse: hello world"}, {"temperature", 0}}.dump(), h_->key_a());
  ASSERT_EQ(cf.status, 200) << cf.body;
  EXPECT_EQ(cf.json()["result"]["response"], "dlrow olleh");
  auto cfs = h_->post("/ai/run/" + h_->model(),
                      json{{"prompt", "reverse: hello world"}, {"temperature", 0}, {"stream", true}}
                          .dump(),
                      h_->key_a());
  ASSERT_EQ(cfs.status, 200) << cfs.body;
  std::string text;
  bool usage = false, done = false;
  for (size_t pos = 0; (pos = cfs.body.find("data: ", pos)) != std::string::npos; pos += 6) {
    std::string line = cfs.body.substr(pos + 6, cfs.body.find('\n', pos) - pos - 6);
    if (line == "[DONE]") {
      done = true;
      continue;
    }
    json ev = json::parse(line);
    text += ev.value("response", "");
    if (ev.contains("usage")) usage = ev["usage"]["completion_tokens"].get<int>() > 0;
  }
  EXPECT_EQ(text, "dlrow olleh");
  EXPECT_TRUE(usage);
  EXPECT_TRUE(done);
  // OpenAI streaming: chunks whose deltas add up to the answer, usage, then [DONE].
  auto s = h_->post("/v1/chat/completions",
                    json{{"model", h_->model()},
                         {"messages", {{{"role", "user"}, {"content", "reverse: stream"}}}},
                         {"temperature", 0}, {"stream", true},
                         {"stream_options", {{"include_usage", true}}}}
                        .dump(),
                    h_->key_a());
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.headers["x-headroom-worker"], "w1");
  text.clear();
  json last_usage;
  for (size_t pos = 0; (pos = s.body.find("data: ", pos)) != std::string::npos; pos += 6) {
    std::string line = s.body.substr(pos + 6, s.body.find('\n', pos) - pos - 6);
    if (line == "[DONE]") continue;
    json ev = json::parse(line);
    if (!ev["choices"].empty()) text += ev["choices"][0]["delta"].value("content", "");
    if (ev.contains("usage")) last_usage = ev["usage"];
  }
  EXPECT_EQ(text, "maerts");
  EXPECT_GT(last_usage["completion_tokens"].get<int>(), 0);
  EXPECT_NE(s.body.find("data: [DONE]"), std::string::npos);
  // Bad input is still refused by the API with the field named, before any worker sees it.
  auto bad = h_->post("/v1/chat/completions",
                      json{{"model", h_->model()}, {"messages", "nope"}}.dump(), h_->key_a());
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(bad.json()["error"]["param"], "messages");
}

TEST_F(Routing, AffinitySticksWhileTheWorkerLivesAndMovesWhenItDies) {
  start_worker("w1");
  start_worker("w2");
  ASSERT_TRUE(wait_live({"w1", "w2"}));
  std::map<std::string, std::string> owner;
  std::set<std::string> used;
  for (int k = 0; k < 16; ++k) {
    std::string key = "conversation-" + std::to_string(k);
    for (int rep = 0; rep < 3; ++rep) {
      auto r = chat("hello world", key);
      ASSERT_EQ(r.status, 200) << r.body;
      EXPECT_EQ(r.json()["choices"][0]["message"]["content"], "dlrow olleh");
      std::string w = r.headers["x-headroom-worker"];
      if (rep == 0) owner[key] = w;
      EXPECT_EQ(w, owner[key]) << key;
      used.insert(w);
    }
  }
  EXPECT_EQ(used.size(), 2u);  // 16 keys land on both workers
  // Without affinity both workers take calls too.
  std::set<std::string> spread;
  for (int i = 0; i < 30; ++i) {
    auto r = chat("flex batch");
    ASSERT_EQ(r.status, 200) << r.body;
    spread.insert(r.headers["x-headroom-worker"]);
  }
  EXPECT_EQ(spread.size(), 2u);
  // w1 dies without a word: its entry lingers until the TTL, but calls that belonged to it are
  // answered by w2 at once, and w2's keys stay where they were.
  stop_worker("w1", SIGKILL);
  for (const auto& [key, w] : owner) {
    auto r = chat("hello world", key);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.headers["x-headroom-worker"], "w2") << key;
    EXPECT_EQ(r.json()["choices"][0]["message"]["content"], "dlrow olleh");
  }
  EXPECT_TRUE(wait_live({"w2"}));  // the dead entry expires
}

TEST_F(Routing, StoppedWorkerWithdrawsAndNoWorkerMeans429WithRetryAfter) {
  start_worker("w1");
  ASSERT_TRUE(wait_live({"w1"}));
  ASSERT_EQ(chat("stream").status, 200);
  stop_worker("w1", SIGTERM);
  // Withdrawn on the way out, not left to expire.
  auto live = registry_->live(h_->model());
  ASSERT_TRUE(live.is_ok());
  EXPECT_TRUE(live->empty());
  // rejectIfBusy: at once; otherwise after the bounded wait (400 ms here).
  auto t0 = std::chrono::steady_clock::now();
  auto r = chat("stream", "", /*reject_if_busy=*/true);
  auto fast = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.headers["Retry-After"], "1");
  EXPECT_EQ(r.json()["error"]["type"], "rate_limit_error");
  auto cf = h_->post("/ai/run/" + h_->model(), json{{"prompt", "reverse: x"}}.dump(), h_->key_a());
  EXPECT_EQ(cf.status, 429) << cf.body;
  EXPECT_EQ(cf.json()["errors"][0]["code"], 3040);
  EXPECT_NE(cf.json()["errors"][0]["message"].get<std::string>().find("Out of capacity"),
            std::string::npos);
  auto waited = std::chrono::steady_clock::now() - t0 - fast;
  EXPECT_GE(waited, std::chrono::milliseconds(350));
  EXPECT_LT(fast, std::chrono::milliseconds(300));
}

TEST_F(Routing, FullWorkersMean429WhileOneWithRoomTakesTheCall) {
  start_worker("w1");
  ASSERT_TRUE(wait_live({"w1"}));
  // Another worker announces itself full: calls never go to it.
  queue::WorkerInfo full;
  full.id = "full";
  full.model = h_->model();
  full.url = "http://127.0.0.1:9";
  full.capacity = 4;
  full.sync_load = 4;
  ASSERT_TRUE(registry_->announce(full, 60000).is_ok());
  ASSERT_TRUE(wait_live({"w1", "full"}));
  for (int i = 0; i < 10; ++i) {
    auto r = chat("hello world", "", true);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.headers["x-headroom-worker"], "w1");
  }
  // Affinity to the full worker with rejectIfBusy: 429 at once rather than moving the session.
  std::string key;
  for (int k = 0; k < 100 && key.empty(); ++k) {
    std::string cand = "k" + std::to_string(k);
    std::vector<queue::WorkerInfo> ws = *registry_->live(h_->model());
    if (ws[api::route_order(ws, std::vector<int>(ws.size(), 0), cand, 0)[0]].id == "full") key = cand;
  }
  ASSERT_FALSE(key.empty());
  auto r = chat("hello world", key, true);
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.headers["Retry-After"], "1");
  ASSERT_TRUE(registry_->withdraw(h_->model(), "full").is_ok());
}

}  // namespace
}  // namespace hr::workers
