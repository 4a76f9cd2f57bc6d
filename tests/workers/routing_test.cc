// Sync requests through the API to separate `headroom worker` processes found in the Redis
// registry: answers (plain and streamed, both API shapes), session affinity, spreading without
// it, failover when a worker is killed, withdrawal on SIGTERM, and 429 code 3040 with Retry-After
// when no worker has room. Clients that leave (mid-stream, while an answer not streamed is
// generated, or while the call waits for room) stop its generation on the worker and leave
// nothing held behind. Calls being generated hold no database connection.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <list>
#include <map>
#include <set>
#include <thread>

#include "api/worker_router.h"
#include "base/ids.h"
#include "base/metrics.h"
#include "base/url.h"
#include "http/server.h"
#include "queue/registry.h"
#include "queue/store.h"
#include "tests/testing/api_harness.h"
#include "tests/testing/process.h"
#include "tests/testing/random_model.h"
#include "wire/chat_request_json.h"

namespace hr::workers {
namespace {

using nlohmann::json;
using tcp = boost::asio::ip::tcp;

// Prompts whose reversal the bundled model gets right.
const std::vector<std::pair<std::string, std::string>> kCases = {
    {"hello world", "dlrow olleh"}, {"flex batch", "hctab xelf"}, {"stream", "maerts"}};

class Routing : public ::testing::Test {
 protected:
  void SetUp() override {
    start_api([](api::ApiConfig& c) { c.sync_queue_timeout_ms = 400; });
  }
  // The API, routing through a WorkerRouter; `configure` adjusts its configuration.
  void start_api(const std::function<void(api::ApiConfig&)>& configure) {
    h_ = std::make_unique<testing::ApiHarness>(configure);
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

  void start_worker(const std::string& name, const std::vector<std::string>& extra = {},
                    const std::string& model_dir = std::string(HEADROOM_SOURCE_DIR) +
                                                   "/models/tiny-reverse") {
    std::vector<std::string> args = {HEADROOM_BINARY,
                                     "--log-level",
                                     "warn",
                                     "worker",
                                     "--model",
                                     model_dir,
                                     "--name",
                                     h_->model(),
                                     "--worker-name",
                                     name,
                                     "--database-url",
                                     h_->database_url(),
                                     "--redis-url",
                                     h_->redis_url(),
                                     "--heartbeat-ms",
                                     "200",
                                     "--drain-seconds",
                                     "2"};
    if (std::find(extra.begin(), extra.end(), "--sync-port") == extra.end()) {
      args.insert(args.end(), {"--sync-port", "0"});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    workers_[name] = testing::spawn(std::move(args));
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
  // 24 calls like `call` through a router over two stand-in workers: "refusing" answers every
  // call it gets with `status` and `body`, "answering" answers "ok". The calls answered, the
  // codes of those that were not, and how many calls the refusing worker got.
  struct StandInRun {
    int answered = 0, refused = 0;
    std::vector<StatusCode> errors;
  };
  StandInRun beside_a_refusing_worker(unsigned status, const std::string& body,
                                      const api::SyncCall& call) {
    StandInRun run;
    std::atomic<int> refused{0};
    http::HttpServerOptions so;
    so.port = 0;
    http::HttpServer refusing(so, http::Handler([&](const http::HttpRequest&) {
                                ++refused;
                                return http::json_response(status, body);
                              }));
    http::HttpServer answering(
        so, http::Handler([](const http::HttpRequest&) {
          return http::json_response(
              200,
              R"({"text":"ok","finish_reason":"stop","prompt_tokens":1,"completion_tokens":1})");
        }));
    EXPECT_TRUE(refusing.start().is_ok() && answering.start().is_ok());
    for (auto [id, server] : {std::pair<std::string, http::HttpServer*>{"refusing", &refusing},
                              {"answering", &answering}}) {
      queue::WorkerInfo w;
      w.id = id;
      w.model = h_->model();
      w.url = "http://127.0.0.1:" + std::to_string(server->port());
      w.capacity = 4;
      EXPECT_TRUE(registry_->announce(w, 60000).is_ok());
    }
    EXPECT_TRUE(wait_live({"refusing", "answering"}));
    api::RouterOptions o;
    o.redis_url = h_->redis_url();
    api::WorkerRouter router(o);
    const wire::ChatRequest request =
        wire::chat_request_from_json({{"messages", {{{"role", "user"}, {"content", "hi"}}}}})
            .value();
    for (int i = 0; i < 24; ++i) {
      auto r = router.run(request, call);
      if (r.is_ok()) {
        ++run.answered;
      } else {
        run.errors.push_back(r.status().code());
      }
    }
    for (const char* id : {"refusing", "answering"})
      EXPECT_TRUE(registry_->withdraw(h_->model(), id).is_ok());
    EXPECT_TRUE(wait_live({}));
    refusing.stop();
    answering.stop();
    run.refused = refused.load();
    return run;
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
  auto cf =
      h_->post("/ai/run/" + h_->model(),
               json{{"prompt", "reverse: hello world"}, {"temperature", 0}}.dump(), h_->key_a());
  ASSERT_EQ(cf.status, 200) << cf.body;
  EXPECT_EQ(cf.json()["result"]["response"], "dlrow olleh");
  auto cfs = h_->post(
      "/ai/run/" + h_->model(),
      json{{"prompt", "reverse: hello world"}, {"temperature", 0}, {"stream", true}}.dump(),
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
                         {"temperature", 0},
                         {"stream", true},
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
  // Log probabilities cross the router: in the answer, and with each streamed piece (Workers AI's
  // shape here), spelling out its text.
  auto lp = h_->post("/v1/chat/completions",
                     json{{"model", h_->model()},
                          {"messages", {{{"role", "user"}, {"content", "reverse: flex batch"}}}},
                          {"temperature", 0},
                          {"logprobs", true},
                          {"top_logprobs", 1}}
                         .dump(),
                     h_->key_a());
  ASSERT_EQ(lp.status, 200) << lp.body;
  const json lp_body = lp.json();
  std::string spelled;
  for (const json& e : lp_body["choices"][0]["logprobs"]["content"])
    spelled += e["token"].get<std::string>();
  EXPECT_EQ(spelled, "hctab xelf");
  auto lps = h_->post("/ai/run/" + h_->model(),
                      json{{"prompt", "reverse: flex batch"},
                           {"temperature", 0},
                           {"stream", true},
                           {"logprobs", true}}
                          .dump(),
                      h_->key_a());
  ASSERT_EQ(lps.status, 200) << lps.body;
  text.clear();
  spelled.clear();
  for (size_t pos = 0; (pos = lps.body.find("data: ", pos)) != std::string::npos; pos += 6) {
    std::string line = lps.body.substr(pos + 6, lps.body.find('\n', pos) - pos - 6);
    if (line == "[DONE]") continue;
    json ev = json::parse(line);
    text += ev.value("response", "");
    if (!ev.contains("logprobs")) continue;
    for (const json& e : ev["logprobs"]["content"]) spelled += e["token"].get<std::string>();
  }
  EXPECT_EQ(text, "hctab xelf");
  EXPECT_EQ(spelled, text);
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
    if (ws[api::route_order(ws, std::vector<int>(ws.size(), 0), cand, 0)[0]].id == "full")
      key = cand;
  }
  ASSERT_FALSE(key.empty());
  auto r = chat("hello world", key, true);
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.headers["Retry-After"], "1");
  ASSERT_TRUE(registry_->withdraw(h_->model(), "full").is_ok());
}

// Router metrics of this process: connections to workers opened, and kept from an earlier call.
struct Connects {
  double opened = 0, reused = 0, failed = 0, idle = 0;
  static Connects now() {
    auto value = [](const std::string& name, const std::string& labels) {
      return metrics::counter(name, "", labels).value();
    };
    Connects c;
    c.opened = value("headroom_sync_worker_connections_total", R"(connection="new")");
    c.reused = value("headroom_sync_worker_connections_total", R"(connection="reused")");
    c.failed = value("headroom_sync_routed_total", R"(outcome="worker_failed")");
    c.idle = metrics::gauge("headroom_sync_worker_connections_idle", "").value();
    return c;
  }
};

TEST_F(Routing, CallsToAWorkerShareOneConnection) {
  start_worker("w1");
  ASSERT_TRUE(wait_live({"w1"}));
  const Connects before = Connects::now();
  // One after another, answered whole and streamed, in both API shapes: one connection for all.
  for (int i = 0; i < 4; ++i) {
    auto r = chat(kCases[i % kCases.size()].first);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json()["choices"][0]["message"]["content"], kCases[i % kCases.size()].second);
  }
  json stream = {{"model", h_->model()},
                 {"messages", {{{"role", "user"}, {"content", "reverse: stream"}}}},
                 {"temperature", 0},
                 {"stream", true}};
  for (int i = 0; i < 2; ++i) {
    auto r = h_->post("/v1/chat/completions", stream.dump(), h_->key_a());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_NE(r.body.find("data: [DONE]"), std::string::npos) << r.body;
  }
  auto cf = h_->post(
      "/ai/run/" + h_->model(),
      json{{"prompt", "reverse: hello world"}, {"temperature", 0}, {"stream", true}}.dump(),
      h_->key_a());
  ASSERT_EQ(cf.status, 200) << cf.body;
  // An error answered by the worker (a prompt longer than its context) leaves it open too.
  json too_long = {{"model", h_->model()},
                   {"messages", {{{"role", "user"}, {"content", std::string(5000, 'x')}}}}};
  auto refused = h_->post("/v1/chat/completions", too_long.dump(), h_->key_a());
  EXPECT_EQ(refused.status, 400) << refused.body;
  const Connects after = Connects::now();
  EXPECT_EQ(after.opened - before.opened, 1);
  EXPECT_EQ(after.reused - before.reused, 7);
  EXPECT_EQ(after.failed, before.failed);
  EXPECT_EQ(after.idle - before.idle, 1);
}

// A connection kept open to a worker that then dies is closed within a few seconds even if no
// other call comes (it would otherwise sit in CLOSE_WAIT until one did).
TEST_F(Routing, ConnectionsAWorkerClosedAreClosedWithoutAnotherCall) {
  start_worker("w1");
  ASSERT_TRUE(wait_live({"w1"}));
  const Connects before = Connects::now();
  auto r = chat("hello world");
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(Connects::now().idle - before.idle, 1);
  stop_worker("w1", SIGKILL);
  double idle = 1;
  for (int i = 0; i < 50 && idle > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    idle = Connects::now().idle - before.idle;
  }
  EXPECT_EQ(idle, 0);
}

// A worker that stops closes the connections kept open to it; once it is back on the same
// address, the next call reaches it on a new connection, without counting it as failed.
TEST_F(Routing, AWorkerBackOnItsAddressIsReachedOnANewConnection) {
  int port = 0;
  {
    boost::asio::io_context ioc;
    tcp::acceptor a(ioc, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }
  const std::vector<std::string> args = {"--sync-port", std::to_string(port)};
  auto listening = [&] {
    for (int i = 0; i < 300; ++i) {
      if (testing::http_call("GET", port, "/metrics").status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  start_worker("w1", args);
  ASSERT_TRUE(wait_live({"w1"}));
  ASSERT_TRUE(listening());
  auto first = chat("hello world");
  ASSERT_EQ(first.status, 200) << first.body;
  const Connects before = Connects::now();
  stop_worker("w1", SIGKILL);
  start_worker("w1", args);
  ASSERT_TRUE(listening());
  ASSERT_TRUE(wait_live({"w1"}));
  for (int i = 0; i < 2; ++i) {
    auto r = chat("flex batch");
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json()["choices"][0]["message"]["content"], "hctab xelf");
  }
  const Connects after = Connects::now();
  EXPECT_EQ(after.opened - before.opened, 1);
  EXPECT_EQ(after.failed, before.failed);
}

// A worker that takes a request on a connection kept open and then never answers is given up on
// after one idle timeout: the request is not sent to it again on a new connection (it may well be
// generating), and the call fails over. The "worker" here answers its first request, then stays
// silent, and counts the requests it gets.
TEST_F(Routing, ASilentWorkerIsNotSentTheRequestTwice) {
  boost::asio::io_context ioc;
  tcp::acceptor acceptor(ioc, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  const int port = acceptor.local_endpoint().port();
  std::atomic<int> requests{0};
  std::atomic<bool> done{false};
  std::list<tcp::socket> kept;
  std::thread fake([&] {
    while (!done) {
      tcp::socket sock(ioc);
      boost::system::error_code ec;
      acceptor.accept(sock, ec);
      if (ec || done) break;
      std::string in;
      char buf[4096];
      for (;;) {  // each request: the header, then Content-Length bytes
        size_t end = in.find("\r\n\r\n");
        size_t cl = in.find("Content-Length: ");
        if (end != std::string::npos && cl != std::string::npos &&
            in.size() >= end + 4 + std::stoul(in.substr(cl + 16))) {
          const size_t next = end + 4 + std::stoul(in.substr(cl + 16));
          in.erase(0, next);
          if (requests.fetch_add(1) == 0) {
            const std::string body =
                R"({"text":"ok","finish_reason":"stop","prompt_tokens":1,"completion_tokens":1})";
            boost::asio::write(
                sock,
                boost::asio::buffer("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                    "Content-Length: " +
                                    std::to_string(body.size()) + "\r\n\r\n" + body),
                ec);
          }
          continue;
        }
        size_t n = sock.read_some(boost::asio::buffer(buf), ec);
        if (ec) break;
        in.append(buf, n);
        if (requests >= 2) {
          kept.push_back(std::move(sock));  // silent from now on, but open
          break;
        }
      }
    }
  });
  queue::WorkerInfo silent;
  silent.id = "silent";
  silent.model = h_->model();
  silent.url = "http://127.0.0.1:" + std::to_string(port);
  silent.capacity = 4;
  ASSERT_TRUE(registry_->announce(silent, 60000).is_ok());
  ASSERT_TRUE(wait_live({"silent"}));
  api::RouterOptions o;
  o.redis_url = h_->redis_url();
  o.idle_timeout_ms = 300;
  api::WorkerRouter router(o);
  api::SyncCall call;
  call.model = h_->model();
  call.reject_if_busy = true;
  const wire::ChatRequest request =
      wire::chat_request_from_json({{"messages", {{{"role", "user"}, {"content", "hi"}}}}}).value();
  auto first = router.run(request, call);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_EQ(first->answer.text, "ok");
  const auto t0 = std::chrono::steady_clock::now();
  auto second = router.run(request, call);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_FALSE(second.is_ok());
  // Give a second send (if there were one) time to arrive before counting.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(requests.load(), 2);
  EXPECT_LT(waited, std::chrono::milliseconds(550));  // one idle timeout, not two
  done = true;
  ASSERT_TRUE(registry_->withdraw(h_->model(), "silent").is_ok());
  boost::system::error_code ignored;
  tcp::socket poke(ioc);
  poke.connect(acceptor.local_endpoint(), ignored);  // wakes the accept loop
  fake.join();
}

// rejectIfBusy means "do not wait for room", not "give up on the first worker that has none for a
// reason of its own": a worker that refuses saying another may take the call (it is stopping) is
// passed over, while one that is merely full still means 429. Two stand-in workers here: one
// answers, the other refuses every call.
TEST_F(Routing, RejectIfBusyPassesOverAWorkerThatIsStopping) {
  for (bool stopping : {true, false}) {
    json error = {{"code", "resource_exhausted"},
                  {"message", "Out of capacity: the worker is stopping"}};
    if (stopping) error["retry_elsewhere"] = true;
    api::SyncCall call;
    call.model = h_->model();
    call.reject_if_busy = true;
    const StandInRun run = beside_a_refusing_worker(429, json{{"error", error}}.dump(), call);
    EXPECT_GT(run.refused, 0) << "the refusing worker was never tried first";
    for (StatusCode code : run.errors) EXPECT_EQ(code, StatusCode::kResourceExhausted);
    if (stopping) {
      EXPECT_EQ(run.answered, 24);
    } else {
      EXPECT_EQ(static_cast<int>(run.errors.size()), run.refused);  // each ends there, with 429
    }
  }
}

// A worker whose engine failed (gave up, or a step got stuck) before a call's answer began says
// another worker may take the call: the router passes it over; without that word its 503 is the
// call's answer. Two stand-in workers: one answers, the other fails every call.
TEST_F(Routing, ACallAFailedWorkerEndedGoesToAnotherWorker) {
  for (bool elsewhere : {true, false}) {
    json error = {{"code", "unavailable"},
                  {"message", "the worker's engine is stuck: a step has run 300.0 s"}};
    if (elsewhere) error["retry_elsewhere"] = true;
    api::SyncCall call;
    call.model = h_->model();
    const StandInRun run = beside_a_refusing_worker(503, json{{"error", error}}.dump(), call);
    EXPECT_GT(run.refused, 0) << "the failing worker was never tried first";
    for (StatusCode code : run.errors) EXPECT_EQ(code, StatusCode::kUnavailable);
    if (elsewhere) {
      EXPECT_EQ(run.answered, 24);
    } else {
      EXPECT_EQ(static_cast<int>(run.errors.size()), run.refused);  // each ends there, with 503
    }
  }
}

// A worker of an earlier release ignores logprobs: its answers, plain or streamed, must not pass
// for answers with log probabilities. A stand-in answers in that release's shape.
TEST_F(Routing, AnswersWithoutTheLogprobsAskedForAreRefused) {
  http::HttpServerOptions so;
  so.port = 0;
  http::HttpServer old(
      so, http::Handler([](const http::HttpRequest& r) {
        const std::string answer =
            R"({"text":"ab","finish_reason":"stop","prompt_tokens":1,"completion_tokens":2})";
        if (json::parse(r.body()).value("stream", false)) {
          return http::json_response(200, R"({"delta":"a"})"
                                          "\n"
                                          R"({"delta":"b"})"
                                          "\n"
                                          R"({"answer":)" +
                                              answer + "}\n");
        }
        return http::json_response(200, answer);
      }));
  ASSERT_TRUE(old.start().is_ok());
  queue::WorkerInfo w;
  w.id = "old";
  w.model = h_->model();
  w.url = "http://127.0.0.1:" + std::to_string(old.port());
  w.capacity = 4;
  ASSERT_TRUE(registry_->announce(w, 60000).is_ok());
  ASSERT_TRUE(wait_live({"old"}));
  json body = {{"model", h_->model()}, {"messages", {{{"role", "user"}, {"content", "x"}}}}};
  auto plain = h_->post("/v1/chat/completions", body.dump(), h_->key_a());
  EXPECT_EQ(plain.status, 200) << plain.body;  // not asked for: fine
  body["logprobs"] = true;
  auto asked = h_->post("/v1/chat/completions", body.dump(), h_->key_a());
  EXPECT_EQ(asked.status, 503) << asked.body;
  EXPECT_NE(asked.body.find("log probabilities"), std::string::npos) << asked.body;
  body["stream"] = true;
  auto streamed = h_->post("/v1/chat/completions", body.dump(), h_->key_a());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_NE(streamed.body.find("log probabilities"), std::string::npos) << streamed.body;
  EXPECT_EQ(streamed.body.find(R"("content":"a")"), std::string::npos)
      << streamed.body;  // no text without them
  auto cf =
      h_->post("/ai/run/" + h_->model(),
               json{{"prompt", "x"}, {"stream", true}, {"logprobs", true}}.dump(), h_->key_a());
  ASSERT_EQ(cf.status, 200) << cf.body;
  EXPECT_NE(cf.body.find("log probabilities"), std::string::npos) << cf.body;
  ASSERT_TRUE(registry_->withdraw(h_->model(), "old").is_ok());
  old.stop();
}

// The endless model: a random-weight Llama in the Hugging Face layout with the bundled model's
// tokenizer and a context of kEndlessContext tokens. Its embedding rows (also the tied LM head) are
// zero but for the printable ASCII bytes, so greedy decoding writes one character per token and
// never ends before max_tokens; a whole answer takes seconds on a CPU.
constexpr int kEndlessContext = 2048;

void write_endless_model(const std::string& dir) {
  testing::RandomLlama spec;
  spec.vocab = 260;
  spec.hidden = 256;
  spec.intermediate = 1024;
  spec.layers = 4;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.context = kEndlessContext;
  spec.rope_theta = 10000.0;
  spec.bf16 = false;
  spec.printable_output = true;
  testing::write_random_llama(dir, std::string(HEADROOM_SOURCE_DIR) + "/models/tiny-reverse", spec);
}

// A client on its own connection: sends one POST, reads the start of the answer, then leaves
// without reading the rest.
class LeavingClient {
 public:
  LeavingClient(int port, const std::string& target, const std::string& body,
                const std::string& key = "") {
    socket_.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"),
                                  static_cast<unsigned short>(port)));
    std::string req =
        "POST " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    if (!key.empty()) req += "Authorization: Bearer " + key + "\r\n";
    req += "\r\n" + body;
    boost::asio::write(socket_, boost::asio::buffer(req));
  }
  // Reads until `marker` has arrived `count` times; false when the connection ends first.
  bool read_until(const std::string& marker, int count) {
    for (;;) {
      int seen = 0;
      for (size_t p = 0; (p = received_.find(marker, p)) != std::string::npos; p += marker.size()) {
        ++seen;
      }
      if (seen >= count) return true;
      char buf[4096];
      boost::system::error_code ec;
      size_t n = socket_.read_some(boost::asio::buffer(buf), ec);
      if (ec) return false;
      received_.append(buf, n);
    }
  }
  // Bytes that arrived and were not read yet.
  size_t unread() { return socket_.available(); }
  void leave() {
    boost::system::error_code ec;
    socket_.close(ec);
  }
  const std::string& received() const { return received_; }

 private:
  boost::asio::io_context ioc_;
  tcp::socket socket_{ioc_};
  std::string received_;
};

// Metrics in the Prometheus text format: series (name and labels, as exposed) → value.
using Metrics = std::map<std::string, double>;

Metrics parse_metrics(const std::string& text) {
  Metrics m;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    size_t sp = line.rfind(' ');
    if (line.empty() || line[0] == '#' || sp == std::string::npos) continue;
    m[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return m;
}

// One scrape of a worker's /metrics.
Metrics scrape(int port) { return parse_metrics(testing::http_call("GET", port, "/metrics").body); }

const std::string kStreamsCancelled = "headroom_streams_cancelled_total";
const std::string kSyncCancelled =
    R"(headroom_requests_finished_total{class="sync",reason="cancelled"})";
const std::string kSyncGenerated = R"(headroom_generation_tokens_total{class="sync"})";
const std::string kSyncRunning = R"(headroom_requests_running{class="sync"})";
const std::string kSyncWaiting = R"(headroom_requests_waiting{class="sync"})";
const std::string kKvUsed = "headroom_kv_cache_blocks_used";

// Sync requests that left the worker's engine, for any reason.
double sync_finished(const Metrics& m) {
  const std::string prefix = R"(headroom_requests_finished_total{class="sync",)";
  double n = 0;
  for (auto it = m.lower_bound(prefix); it != m.end() && it->first.rfind(prefix, 0) == 0; ++it) {
    n += it->second;
  }
  return n;
}

// Streams on the endless model whose clients leave before the end.
class LeavingClients : public Routing {
 protected:
  static constexpr int kMaxTokens = 2000;

  void SetUp() override {
    model_dir_ = ::testing::TempDir() + "endless_model_" + random_hex(4);
    write_endless_model(model_dir_);
    start_api([](api::ApiConfig& c) {
      const std::string& m = c.models.at(0);
      c.models = {m.substr(0, m.rfind(':') + 1) + std::to_string(kEndlessContext)};
      c.sync_queue_timeout_ms = 10000;
      // One database connection for all of the handlers: calls being generated must not hold it.
      c.handler_threads = 12;
      c.db_connections = 1;
      c.db_wait_ms = 500;
    });
  }
  void TearDown() override {
    Routing::TearDown();
    std::filesystem::remove_all(model_dir_);
  }
  // The port of worker `name`'s endpoint (sync calls and /metrics), from its registry entry.
  int port_of(const std::string& name) {
    auto live = registry_->live(h_->model());
    if (!live.is_ok()) return 0;
    for (const auto& w : *live) {
      if (w.id == name) {
        Result<Url> u = parse_url(w.url);
        return u.is_ok() ? u->port : 0;
      }
    }
    return 0;
  }
  json request(int max_tokens = kMaxTokens) const {
    return {{"messages", {{{"role", "user"}, {"content", "write"}}}},
            {"max_tokens", max_tokens},
            {"temperature", 0}};
  }
  // request() for the API's model, as a chat completion; streamed or not.
  json chat(bool stream = false) const {
    json body = request();
    body["model"] = h_->model();
    if (stream) body["stream"] = true;
    return body;
  }
  json chat_stream() const { return chat(true); }
  // Starts worker "w1" on the endless model and waits until it is live; its endpoint's port, or 0.
  int start_w1(const std::vector<std::string>& extra = {}) {
    start_worker("w1", extra, model_dir_);
    return wait_live({"w1"}) ? port_of("w1") : 0;
  }
  // Waits (up to 30 s) until `n` more sync requests than in `before` have left the worker's
  // engine and it holds no sync request and no KV block; returns the last scrape.
  Metrics settled(int port, const Metrics& before, int n) {
    Metrics m;
    for (int i = 0; i < 600; ++i) {
      m = scrape(port);
      if (sync_finished(m) >= sync_finished(before) + n && m[kSyncRunning] == 0 &&
          m[kSyncWaiting] == 0 && m[kKvUsed] == 0) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return m;
  }
  // `n` more streams than in `before` were cancelled in the engine, each before half of
  // max_tokens (a stream runs for a few hundred milliseconds before its client leaves: some 500
  // tokens on a busy machine), and nothing is left running or holding KV blocks.
  static void expect_cancelled(Metrics before, Metrics after, int n) {
    EXPECT_EQ(after[kStreamsCancelled] - before[kStreamsCancelled], n);
    EXPECT_EQ(after[kSyncCancelled] - before[kSyncCancelled], n);
    EXPECT_EQ(sync_finished(after) - sync_finished(before), n);  // none ran to max_tokens
    EXPECT_LT(after[kSyncGenerated] - before[kSyncGenerated], n * kMaxTokens / 2);
    EXPECT_EQ(after[kSyncRunning], 0);
    EXPECT_EQ(after[kSyncWaiting], 0);
    EXPECT_EQ(after[kKvUsed], 0);
  }

  // One POST a leaving client makes: where to, what, and with which key.
  struct Call {
    const char* what;
    int port;
    std::string target;
    std::string body;
    std::string key;
    LeavingClient open() const { return LeavingClient(port, target, body, key); }
  };

  std::string model_dir_;
};

TEST_F(LeavingClients, MidStreamStopsTheGeneration) {
  const int port = start_w1();
  ASSERT_GT(port, 0);
  struct Case {
    Call call;
    std::string marker;  // one per piece of the answer
    int pieces;          // read before leaving
  };
  const std::vector<Case> cases = {
      {{"OpenAI shape", h_->port(), "/v1/chat/completions", chat_stream().dump(), h_->key_a()},
       "data: ",
       3},
      {{"Workers AI shape", h_->port(), "/ai/run/" + h_->model(),
        json{{"prompt", "write"}, {"max_tokens", kMaxTokens}, {"temperature", 0}, {"stream", true}}
            .dump(),
        h_->key_a()},
       "data: ",
       2},
      {{"the worker's own endpoint", port, "/internal/sync",
        json{{"request", request()}, {"stream", true}}.dump(), ""},
       R"({"delta")",
       2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.call.what);
    Metrics before = scrape(port);
    LeavingClient client = c.call.open();
    ASSERT_TRUE(client.read_until(c.marker, c.pieces)) << client.received();
    EXPECT_NE(client.received().find(" 200 OK"), std::string::npos) << client.received();
    client.leave();
    expect_cancelled(before, settled(port, before, 1), 1);
  }
}

// service_tier "flex": a flex call runs in the engine's async class on the room sync calls
// leave. With one sequence slot held by a long flex call, another flex call cannot start and gets
// OpenAI's 429 resource_unavailable after its own timeout, while a sync call takes the slot at
// once (async work gives way); the long call still ends with its whole answer, and every answer
// echoes its tier (also in each streamed chunk). A bad tier is refused naming the field.
TEST_F(LeavingClients, FlexCallsRunOnTheRoomSyncLeavesAndGiveUpInTime) {
  ASSERT_GT(start_w1({"--max-num-seqs", "1", "--reserve-slots", "0"}), 0);
  auto call = [&](json body) {
    body["model"] = h_->model();
    return h_->post("/v1/chat/completions", body.dump(), h_->key_a());
  };
  testing::HttpResult long_flex;
  std::thread first([&] {
    json body = request(2000);  // a few seconds of work
    body["service_tier"] = "flex";
    long_flex = call(body);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it holds the slot now
  json starved = request(5);
  starved["service_tier"] = "flex";
  starved["flex_timeout_s"] = 0.3;
  auto t0 = std::chrono::steady_clock::now();
  testing::HttpResult refused = call(starved);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_EQ(refused.json()["error"]["code"], "resource_unavailable") << refused.body;
  EXPECT_EQ(refused.json()["error"]["type"], "rate_limit_error");
  EXPECT_EQ(refused.json()["error"]["param"], "service_tier");
  EXPECT_GE(waited, 0.25);
  EXPECT_LT(waited, 3.0);
  t0 = std::chrono::steady_clock::now();
  testing::HttpResult sync = call(request(5));
  const double sync_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(sync.status, 200) << sync.body;
  EXPECT_EQ(sync.json()["service_tier"], "default");
  EXPECT_LT(sync_s, 2.0) << "a sync call waited behind flex work";
  first.join();
  ASSERT_EQ(long_flex.status, 200) << long_flex.body;
  EXPECT_EQ(long_flex.json()["service_tier"], "flex");
  EXPECT_EQ(long_flex.json()["usage"]["completion_tokens"], 2000);
  // Streamed: every chunk says its tier. Workers AI's shape takes options.service_tier.
  json stream = request(5);
  stream["service_tier"] = "flex";
  stream["stream"] = true;
  testing::HttpResult chunks = call(stream);
  ASSERT_EQ(chunks.status, 200) << chunks.body;
  EXPECT_NE(chunks.body.find(R"("service_tier":"flex")"), std::string::npos) << chunks.body;
  EXPECT_EQ(chunks.body.find(R"("service_tier":"default")"), std::string::npos) << chunks.body;
  json workers_ai = request(5);
  workers_ai["options"] = {{"service_tier", "flex"}};
  testing::HttpResult w = h_->post("/ai/run/" + h_->model(), workers_ai.dump(), h_->key_a());
  ASSERT_EQ(w.status, 200) << w.body;
  EXPECT_EQ(w.json()["result"]["service_tier"], "flex");
  json bad = request(5);
  bad["service_tier"] = "priority";
  testing::HttpResult b = call(bad);
  EXPECT_EQ(b.status, 400) << b.body;
  EXPECT_EQ(b.json()["error"]["param"], "service_tier");
}

// A call answered whole (not streamed) whose client leaves while the answer is generated: the
// API's router closes its connection to the worker, the worker cancels the generation, and
// nothing is left behind; the same on the worker's own endpoint.
TEST_F(LeavingClients, UnstreamedCallStopsWhenItsClientLeaves) {
  const int port = start_w1();
  ASSERT_GT(port, 0);
  const json chat = this->chat();
  struct Case {
    Call call;
    int router_gone;  // calls the API's router counts as their client gone
  };
  const std::vector<Case> cases = {
      {{"through the API", h_->port(), "/v1/chat/completions", chat.dump(), h_->key_a()}, 1},
      {{"the worker's own endpoint", port, "/internal/sync", json{{"request", request()}}.dump(),
        ""},
       0},
  };
  const std::string cancelled = "headroom_sync_calls_cancelled_total";
  const std::string router_gone = R"(headroom_sync_routed_total{outcome="client_gone"})";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.call.what);
    Metrics before = scrape(port);
    Metrics api_before = parse_metrics(metrics::render());
    LeavingClient client = c.call.open();
    // Generating: the worker's engine holds it.
    Metrics during;
    for (int i = 0; i < 200; ++i) {
      during = scrape(port);
      if (during[kSyncRunning] >= 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_GE(during[kSyncRunning], 1);
    EXPECT_EQ(client.unread(), 0u);  // no answer yet
    client.leave();
    Metrics after = settled(port, before, 1);
    EXPECT_EQ(after[cancelled] - before[cancelled], 1);
    EXPECT_EQ(after[kSyncCancelled] - before[kSyncCancelled], 1);
    EXPECT_EQ(after[kStreamsCancelled], before[kStreamsCancelled]);
    EXPECT_LT(after[kSyncGenerated] - before[kSyncGenerated], kMaxTokens / 4);
    EXPECT_EQ(after[kSyncRunning], 0);
    EXPECT_EQ(after[kKvUsed], 0);
    Metrics api_after = parse_metrics(metrics::render());
    EXPECT_EQ(api_after[router_gone] - api_before[router_gone], c.router_gone);
  }
}

// Sync calls give their database connection back before they wait on the worker: with one
// connection for all of the API's handlers, four calls being generated (two streamed) leave it
// free, and requests that need the database (a key not seen yet, a listing) are answered.
TEST_F(LeavingClients, CallsBeingGeneratedHoldNoDatabaseConnection) {
  const int port = start_w1();
  ASSERT_GT(port, 0);
  // A key of its own for each call, so that each one looks its key up in the database.
  std::vector<std::string> keys;
  {
    pqxx::connection c(h_->database_url());
    for (int i = 0; i < 5; ++i) {
      auto k = queue::create_api_key(c, "carol");
      ASSERT_TRUE(k.is_ok());
      keys.push_back(k->key);
    }
  }
  Metrics before = scrape(port);
  std::list<LeavingClient> calls;
  for (int i = 0; i < 4; ++i) {
    calls.emplace_back(h_->port(), "/v1/chat/completions", chat(/*stream=*/i % 2 == 1).dump(),
                       keys[i]);
  }
  Metrics during;
  for (int i = 0; i < 400; ++i) {
    during = scrape(port);
    if (during[kSyncRunning] >= 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(during[kSyncRunning], 4);
  for (int i = 0; i < 3; ++i) {
    auto r = h_->get("/v1/async", keys[4]);
    EXPECT_EQ(r.status, 200) << r.body;
  }
  Metrics api = parse_metrics(h_->get("/metrics", "").body);
  EXPECT_EQ(api[R"(headroom_api_db_connections{state="lent"})"], 0);
  EXPECT_EQ(api[R"(headroom_api_db_connections{state="idle"})"], 1);
  EXPECT_EQ(scrape(port)[kSyncRunning], 4) << "the calls ended before the requests were answered";
  for (LeavingClient& c : calls) c.leave();
  Metrics after = settled(port, before, 4);
  EXPECT_EQ(after[kSyncCancelled] - before[kSyncCancelled], 4);
  EXPECT_EQ(after[kStreamsCancelled] - before[kStreamsCancelled], 2);
  EXPECT_EQ(
      after["headroom_sync_calls_cancelled_total"] - before["headroom_sync_calls_cancelled_total"],
      2);
  EXPECT_EQ(after[kSyncRunning], 0);
  EXPECT_EQ(after[kKvUsed], 0);
}

TEST_F(LeavingClients, WhileWaitingForRoomLeavesNothingBehind) {
  // One sequence at a time: a second call waits in the API's router for the first to end.
  const int port = start_w1({"--max-num-seqs", "1", "--reserve-slots", "0"});
  ASSERT_GT(port, 0);
  // The API runs in this process: its metrics tell when it has answered a call.
  const std::string answered =
      R"(headroom_http_response_seconds_count{route="/v1/chat/completions"})";
  const std::string streamed =
      R"(headroom_http_requests_total{route="/v1/chat/completions",code="200"})";
  Metrics api_before = parse_metrics(metrics::render());
  Metrics before = scrape(port);
  LeavingClient running(h_->port(), "/v1/chat/completions", chat_stream().dump(), h_->key_a());
  ASSERT_TRUE(running.read_until("data: ", 3)) << running.received();
  LeavingClient waiting(h_->port(), "/v1/chat/completions", chat_stream().dump(), h_->key_a());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(waiting.unread(), 0u);  // no answer yet, not even a refusal
  waiting.leave();
  running.leave();
  // The router notices that the waiting call's client left: the call never reaches the worker,
  // and the running one is cancelled there.
  const std::string gone = R"(headroom_sync_routed_total{outcome="client_gone"})";
  Metrics api_after;
  for (int i = 0; i < 300; ++i) {
    api_after = parse_metrics(metrics::render());
    if (api_after[answered] - api_before[answered] >= 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(api_after[answered] - api_before[answered], 2);
  EXPECT_EQ(api_after[gone] - api_before[gone], 1);
  int reached = static_cast<int>(api_after[streamed] - api_before[streamed]);
  ASSERT_EQ(reached, 1);
  expect_cancelled(before, settled(port, before, reached), reached);
  // The worker's one slot is free again (its load reaches the API with its next heartbeat).
  json small = request(8);
  small["model"] = h_->model();
  small["options"] = {{"rejectIfBusy", true}};
  testing::HttpResult r;
  for (int i = 0; i < 40; ++i) {
    r = h_->post("/v1/chat/completions", small.dump(), h_->key_a());
    if (r.status != 429) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["usage"]["completion_tokens"], 8);
}

}  // namespace
}  // namespace hr::workers
