// End to end on real Postgres, Redis and HTTP with the bundled model: batches submitted through the
// API are relayed by the dispatcher and run by workers pulling into their headroom; every answer
// is the correct reversal, in input order, with usage, and each request is completed once.
#include "workers/worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "cmd/worker_sync.h"
#include "engine/chat_template.h"
#include "engine/cpu_backend.h"
#include "engine/weights.h"
#include "queue/dispatcher.h"
#include "tests/testing/api_harness.h"
#include "tests/testing/http_client.h"
#include "wire/chat_request_json.h"
#include "workers/sync_server.h"

namespace hr::workers {
namespace {

using nlohmann::json;

const std::string kModelDir = std::string(HEADROOM_SOURCE_DIR) + "/models/tiny-reverse";

struct DispatcherThread {
  std::atomic<bool> stop{false};
  std::thread t;
  DispatcherThread(const std::string& db, const std::string& redis) {
    t = std::thread([this, db, redis] {
      queue::DispatcherOptions o;
      o.tick_ms = 50;
      auto d = queue::Dispatcher::create(db, redis, o);
      if (d.is_ok()) (*d)->run(stop);
    });
  }
  ~DispatcherThread() {
    stop = true;
    t.join();
  }
};

// A worker on the bundled model; on `backend` when one is given; `tweak` changes its config.
std::unique_ptr<Worker> make_worker(testing::ApiHarness& h, const std::string& name,
                                    double max_utilization = 1.0, int drain_seconds = 5,
                                    std::shared_ptr<engine::Backend> backend = nullptr,
                                    const std::function<void(WorkerConfig&)>& tweak = nullptr) {
  WorkerConfig wc;
  wc.max_utilization = max_utilization;
  wc.model_dir = kModelDir;
  wc.model_name = h.model();
  wc.worker_name = name;
  wc.lease_seconds = 10;
  wc.drain_seconds = drain_seconds;
  if (tweak) tweak(wc);
  queue::StoreConfig sc;
  sc.database_url = h.database_url();
  sc.redis_url = h.redis_url();
  auto w = Worker::create(wc, sc, std::move(backend));
  EXPECT_TRUE(w.is_ok()) << w.status().to_string();
  return w.is_ok() ? std::move(w).value() : nullptr;
}

// A harness whose model one in-process worker serves, started: queued (a dispatcher relays the
// batches) and sync (the API's sync calls go to the worker). `tweak` changes the worker's config.
struct ServedHarness {
  explicit ServedHarness(const std::string& name = "w",
                         const std::function<void(WorkerConfig&)>& tweak = nullptr)
      : d(h.database_url(), h.redis_url()), w(make_worker(h, name, 1.0, 5, nullptr, tweak)) {
    if (!h.ok() || !w) return;
    sync = std::make_unique<cmd::WorkerSync>(*w);
    h.api().set_sync_inference(sync.get());
    started = w->start().is_ok();
  }
  // The API's operator view asks the sync side for its workers from a thread of its own: unset
  // before the sync side and the worker go.
  ~ServedHarness() {
    if (sync) h.api().set_sync_inference(nullptr);
  }
  bool ok() const { return started; }
  testing::ApiHarness h;
  DispatcherThread d;
  std::unique_ptr<Worker> w;
  std::unique_ptr<cmd::WorkerSync> sync;
  bool started = false;
};

std::vector<std::string> random_texts(int n, int seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string s;
    int len = 1 + static_cast<int>(rng() % 24);
    for (int k = 0; k < len; ++k) s += static_cast<char>('a' + rng() % 26);
    out.push_back(s);
  }
  return out;
}

json wait_done(testing::ApiHarness& h, const std::string& id, int seconds,
               const std::string& key = "") {
  for (int i = 0; i < seconds * 10; ++i) {
    json r = h.get("/v1/async/" + id, key.empty() ? h.key_a() : key).json()["result"];
    if (r.contains("responses")) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return json();
}

// The bundled model's own greedy answer for "reverse: <text>", computed by an engine alone, with
// the penalties of `penalties` (greedy decoding is deterministic and batch-invariant, so the
// served answer must equal it exactly).
std::string greedy_alone(const std::string& text, const engine::Penalties& penalties = {},
                         const std::string& model_dir = kModelDir, int max_tokens = 40) {
  static std::map<std::string, std::shared_ptr<const engine::ModelWeights>> loaded;
  static std::map<std::string, std::shared_ptr<const engine::Tokenizer>> tokenizers;
  auto& weights = loaded[model_dir];
  if (!weights) {
    engine::ModelWeights w = engine::load_weights(model_dir).value();
    engine::pack_for_cpu(&w);  // once, for every engine built here
    weights = std::make_shared<const engine::ModelWeights>(std::move(w));
    tokenizers[model_dir].reset(engine::Tokenizer::load(model_dir).value().release());
  }
  const auto& tok = tokenizers[model_dir];
  auto backend = engine::CpuBackend::create(weights, {16, 4 << 20, 1}).value();
  auto eng =
      engine::Engine::create(std::shared_ptr<engine::Backend>(std::move(backend)), tok, 128, {})
          .value();
  engine::GenerationRequest r;
  r.prompt =
      tok->encode(engine::render_chat(engine::ChatFormat::kHeadroom, {{"user", "reverse: " + text}},
                                      tok->bos_text(), tok->eos_text())
                      .value());
  r.params.max_tokens = max_tokens;
  r.params.penalties = penalties;
  std::string out;
  r.on_event = [&](const engine::TokenEvent& ev) { out += ev.text_delta; };
  EXPECT_TRUE(eng->add(std::move(r)).is_ok());
  while (eng->has_work()) EXPECT_TRUE(eng->step().is_ok());
  return out;
}

void check_answers(const json& result, const std::vector<std::string>& texts) {
  ASSERT_TRUE(result.is_object());
  EXPECT_EQ(result["status"], "completed");
  ASSERT_EQ(result["responses"].size(), texts.size());
  int correct = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const json& r = result["responses"][i];
    EXPECT_EQ(r["id"], static_cast<int>(i));
    EXPECT_EQ(r["success"], true);
    std::string got = r["result"]["response"];
    EXPECT_EQ(got, greedy_alone(texts[i])) << "request " << i;
    if (got == std::string(texts[i].rbegin(), texts[i].rend())) ++correct;
    EXPECT_GT(r["result"]["usage"]["prompt_tokens"].get<int>(), 0);
    EXPECT_EQ(r["result"]["usage"]["completion_tokens"].get<int>(),
              static_cast<int>(got.size()) + 1);
  }
  // The model itself is right on about 99.6% of held-out prompts.
  EXPECT_GE(correct, static_cast<int>(texts.size() * 98 / 100));
  std::printf("correct reversals: %d of %zu\n", correct, texts.size());
}

// The JSON events of a server-sent event stream (data: lines other than [DONE]).
std::vector<json> sse_events(const std::string& body) {
  std::vector<json> out;
  for (size_t pos = 0; (pos = body.find("data: ", pos)) != std::string::npos;) {
    const size_t end = body.find("\n\n", pos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data != "[DONE]") out.push_back(json::parse(data));
  }
  return out;
}

// OpenAI's logprobs object of a greedy answer `text` that ended with EOS: one entry per answer
// token (the EOS has none), whose texts make up the answer, each with `top` alternatives highest
// first, the first of them the token itself.
void check_logprobs(const json& lp, const std::string& text, int top, int completion_tokens) {
  ASSERT_TRUE(lp.is_object()) << lp.dump();
  ASSERT_TRUE(lp["content"].is_array()) << lp.dump();
  EXPECT_TRUE(lp.contains("refusal"));
  const json& content = lp["content"];
  EXPECT_EQ(static_cast<int>(content.size()), completion_tokens - 1);
  std::string joined;
  for (const json& e : content) {
    joined += e["token"].get<std::string>();
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    EXPECT_EQ(e["bytes"].size(), e["token"].get<std::string>().size());  // ASCII here
    ASSERT_EQ(static_cast<int>(e["top_logprobs"].size()), top) << e.dump();
    for (int k = 0; k + 1 < top; ++k) {
      EXPECT_GE(e["top_logprobs"][k]["logprob"].get<double>(),
                e["top_logprobs"][k + 1]["logprob"].get<double>());
    }
    if (top > 0) {
      EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
      EXPECT_NEAR(e["top_logprobs"][0]["logprob"].get<double>(), e["logprob"].get<double>(), 1e-6);
    }
  }
  EXPECT_EQ(joined, text);
}

TEST(WorkerE2eTest, QueuedBatchIsAnsweredCorrectlyInOrder) {
  testing::ApiHarness h;
  ASSERT_TRUE(h.ok());
  DispatcherThread d(h.database_url(), h.redis_url());
  auto w = make_worker(h, "w1");
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->start().is_ok());
  auto texts = random_texts(200, 1);
  json reqs = json::array();
  for (const auto& t : texts) {
    reqs.push_back({{"messages", {{{"role", "user"}, {"content", "reverse: " + t}}}},
                    {"temperature", 0},
                    {"max_tokens", 40}});
  }
  for (int i = 0; i < 5; ++i) {  // log probabilities for a few
    reqs[i]["logprobs"] = true;
    reqs[i]["top_logprobs"] = i;
  }
  std::string id = h.submit(reqs, h.key_a());
  ASSERT_FALSE(id.empty());
  json result = wait_done(h, id, 120);
  check_answers(result, texts);
  for (int i = 0; i < 7; ++i) {
    const json& r = result["responses"][i]["result"];
    if (i >= 5) {
      EXPECT_FALSE(r.contains("logprobs")) << r.dump();
      continue;
    }
    check_logprobs(r["logprobs"], r["response"], i, r["usage"]["completion_tokens"]);
  }
  EXPECT_GT(result["usage"]["completion_tokens"].get<int>(), 200);
  w->stop();
  EXPECT_EQ(w->stats().completed.load(), 200);
  EXPECT_EQ(w->stats().braked.load(), 0);  // the brake is off by default
}

// A newcomer far behind its share starts at once on a busy worker: account A's backlog fills the
// worker's slots; account B's requests come through the catch-up stream, taken past the worker's
// headroom, and run ahead of A's (which wait, or are preempted and later finished from their
// tokens, with the answers they would have had; tests/engine/scheduler_test.cc steps the
// preemption itself).
TEST(WorkerE2eTest, ANewcomersRequestsStartAtOnceOnABusyWorker) {
  ServedHarness s("w", [](WorkerConfig& c) {
    c.max_num_seqs = 4;
    c.reserve_slots = 1;
  });
  ASSERT_TRUE(s.ok());
  testing::ApiHarness& h = s.h;
  auto requests = [](const std::vector<std::string>& texts) {
    json reqs = json::array();
    for (const auto& t : texts) {
      reqs.push_back({{"messages", {{{"role", "user"}, {"content", "reverse: " + t}}}},
                      {"temperature", 0},
                      {"max_tokens", 40}});
    }
    return reqs;
  };
  const auto texts_a = random_texts(300, 21);
  const std::string a = h.submit(requests(texts_a), h.key_a());
  ASSERT_FALSE(a.empty());
  // A's running steadily: some done (their lengths differ, so the slots free up at different
  // times) and every slot busy.
  for (int i = 0; i < 1500; ++i) {
    if (h.scalar("SELECT count(*) FROM requests WHERE status = 'completed'") >= 6 &&
        s.w->load().async_running >= 3) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const auto texts_b = random_texts(3, 22);
  const std::string b = h.submit(requests(texts_b), h.key_b());
  ASSERT_FALSE(b.empty());
  const json result_b = wait_done(h, b, 60, h.key_b());
  const int64_t a_ended = h.scalar(
      "SELECT count(*) FROM requests WHERE status = 'completed' AND batch_id = '" + a + "'::uuid");
  check_answers(result_b, texts_b);
  EXPECT_LT(a_ended, 250) << "B waited for most of A's backlog";
  // How many of B's go by the catch-up stream depends on A's work in flight at the relay's pass
  // (the pieces that bring B up to half of it, or all three when it is still below): at least one.
  EXPECT_GE(s.w->stats().caught_up.load(), 1);
  EXPECT_LE(s.w->stats().caught_up.load(), 3);
  // A's, preempted or not, all answered as they would have been alone.
  check_answers(wait_done(h, a, 120), texts_a);
  s.w->stop();
}

// Tools, earlier calls and tool results reach the model's own template (the bundled model's
// ignores them and answers as ever); an answer without calls ends with stop, streamed or not.
TEST(WorkerE2eTest, RequestsWithToolsAreAnsweredByTheModelsTemplate) {
  testing::ApiHarness h;
  ASSERT_TRUE(h.ok());
  auto w = make_worker(h, "w");
  ASSERT_TRUE(w);
  cmd::WorkerSync worker_sync(*w);
  testing::ScopedSyncSide sync_side(h.api(), &worker_sync);
  ASSERT_TRUE(w->start().is_ok());
  const json tools = {{{"type", "function"},
                       {"function", {{"name", "lookup"}, {"parameters", {{"type", "object"}}}}}}};
  json body = {{"model", h.model()},
               {"temperature", 0},
               {"messages", {{{"role", "user"}, {"content", "reverse: hello"}}}},
               {"tools", tools}};
  auto r = h.post("/v1/chat/completions", body.dump(), h.key_a());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["choices"][0]["message"]["content"], "olleh");
  EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(r.json()["choices"][0]["message"].contains("tool_calls"));
  // An earlier call and its result are taken (the conversation is the model's to read).
  body["messages"] = {{{"role", "user"}, {"content", "reverse: abc"}},
                      {{"role", "assistant"},
                       {"content", nullptr},
                       {"tool_calls",
                        {{{"id", "call_1"},
                          {"type", "function"},
                          {"function", {{"name", "lookup"}, {"arguments", R"({"q": "abc"})"}}}}}}},
                      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "found"}},
                      {{"role", "user"}, {"content", "reverse: hello"}}};
  auto turns = h.post("/v1/chat/completions", body.dump(), h.key_a());
  ASSERT_EQ(turns.status, 200) << turns.body;
  EXPECT_TRUE(turns.json()["choices"][0]["message"]["content"].is_string());
  EXPECT_NE(turns.json()["choices"][0]["finish_reason"], "tool_calls");
  // Streamed, the answer goes out as text (it holds no call), and ends with stop.
  body["messages"] = {{{"role", "user"}, {"content", "reverse: hello"}}};
  body["stream"] = true;
  auto s = h.post("/v1/chat/completions", body.dump(), h.key_a());
  ASSERT_EQ(s.status, 200) << s.body;
  std::string streamed;
  for (size_t at = s.body.find("data: {"); at != std::string::npos;
       at = s.body.find("data: {", at + 1)) {
    const json chunk = json::parse(s.body.substr(at + 6, s.body.find("\n", at) - at - 6));
    if (chunk["choices"].empty()) continue;
    const json& delta = chunk["choices"][0]["delta"];
    EXPECT_FALSE(delta.contains("tool_calls"));
    if (delta.contains("content")) streamed += delta["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, "olleh");
  EXPECT_NE(s.body.find("\"finish_reason\":\"stop\""), std::string::npos) << s.body;
  w->stop();
}

// Structured output on Workers AI's queued route: JSON mode answers the document itself (valid
// for its schema), json_object an object, tool_choice required a call whose arguments follow the
// tool's parameters; a schema keyword not supported is refused at submit, naming it.
TEST(WorkerE2eTest, QueuedStructuredOutputAndRequiredToolCalls) {
  testing::ApiHarness h;
  ASSERT_TRUE(h.ok());
  DispatcherThread d(h.database_url(), h.redis_url());
  auto w = make_worker(h, "w1");
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->start().is_ok());
  const json schema = {
      {"type", "object"},
      {"properties",
       {{"name", {{"type", "string"}, {"maxLength", 8}}},
        {"score", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}},
        {"tags", {{"type", "array"}, {"items", {{"enum", {"x", "y"}}}}, {"maxItems", 2}}}}},
      {"required", {"name", "score"}}};
  json params = {{"type", "object"}, {"required", {"q"}}};
  params["properties"]["q"] = {{"type", "string"}, {"maxLength", 6}};
  json tools = json::array();
  tools.push_back({{"name", "lookup"}, {"parameters", params}});
  json reqs = json::array();
  for (int i = 0; i < 6; ++i) {
    json r = {{"prompt", "reverse: abc"}, {"temperature", 1}, {"seed", i}, {"max_tokens", 90}};
    if (i < 2) r["response_format"] = {{"type", "json_schema"}, {"json_schema", schema}};
    if (i == 2 || i == 3) r["response_format"] = {{"type", "json_object"}};
    if (i >= 4) {
      r["tools"] = tools;
      r["tool_choice"] = "required";
    }
    reqs.push_back(r);
  }
  std::string id = h.submit(reqs, h.key_a());
  ASSERT_FALSE(id.empty());
  json result = wait_done(h, id, 120);
  ASSERT_EQ(result["responses"].size(), 6u) << result.dump();
  for (int i = 0; i < 6; ++i) {
    const json& r = result["responses"][i]["result"];
    if (i < 2) {
      const json& doc = r["response"];
      ASSERT_TRUE(doc.is_object()) << r.dump();
      EXPECT_TRUE(doc["name"].is_string() && doc["name"].get<std::string>().size() <= 32);
      EXPECT_TRUE(doc["score"].is_number_integer());
      EXPECT_GE(doc["score"].get<int>(), 0);
      EXPECT_LE(doc["score"].get<int>(), 9);
      EXPECT_EQ(r["finish_reason"], "stop");
    } else if (i < 4) {
      EXPECT_TRUE(r["response"].is_object()) << r.dump();
    } else {
      ASSERT_TRUE(r.contains("tool_calls")) << r.dump();
      EXPECT_EQ(r["tool_calls"][0]["name"], "lookup");
      EXPECT_TRUE(r["tool_calls"][0]["arguments"]["q"].is_string()) << r.dump();
      EXPECT_EQ(r["finish_reason"], "tool_calls");
    }
  }
  json bad_schema = {{"type", "object"}};
  bad_schema["properties"]["e"] = {{"type", "string"}, {"format", "email"}};
  json bad_request = {{"prompt", "x"}};
  bad_request["response_format"] = {{"type", "json_schema"}, {"json_schema", bad_schema}};
  json bad = json::array();
  bad.push_back(bad_request);
  json bad_body = {{"requests", bad}};
  auto refused = h.post("/ai/run/" + h.model() + "?queueRequest=true", bad_body.dump(), h.key_a());
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("requests[0].response_format.json_schema.properties.e.format"),
            std::string::npos)
      << refused.body;
  w->stop();
}

TEST(WorkerE2eTest, UtilizationBrakeHoldsBackPullsAndStarvesNothing) {
  testing::ApiHarness h;
  ASSERT_TRUE(h.ok());
  DispatcherThread d(h.database_url(), h.redis_url());
  auto w = make_worker(h, "braked", /*max_utilization=*/0.2);
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->start().is_ok());
  auto texts = random_texts(300, 7);
  json reqs = json::array();
  for (const auto& t : texts) reqs.push_back({{"prompt", "reverse: " + t}, {"temperature", 0}});
  std::string id = h.submit(reqs, h.key_a());
  ASSERT_FALSE(id.empty());
  json result = wait_done(h, id, 180);
  check_answers(result, texts);
  w->stop();
  // The engine was busier than 20% of the time while it worked, so pulls were held back; every
  // request still ran once the engine went idle.
  EXPECT_GT(w->stats().braked.load(), 0);
  EXPECT_EQ(w->stats().completed.load(), 300);
}

TEST(WorkerE2eTest, TwoWorkersSplitABatchAndCompleteEachRequestOnce) {
  testing::ApiHarness h;
  ASSERT_TRUE(h.ok());
  DispatcherThread d(h.database_url(), h.redis_url());
  auto w1 = make_worker(h, "w1");
  auto w2 = make_worker(h, "w2");
  ASSERT_TRUE(w1 && w2);
  ASSERT_TRUE(w1->start().is_ok());
  ASSERT_TRUE(w2->start().is_ok());
  auto texts = random_texts(120, 2);
  json reqs = json::array();
  for (const auto& t : texts) reqs.push_back({{"prompt", "reverse: " + t}, {"temperature", 0}});
  std::string id = h.submit(reqs, h.key_a());
  json result = wait_done(h, id, 120);
  check_answers(result, texts);
  w1->stop();
  w2->stop();
  EXPECT_EQ(w1->stats().completed.load() + w2->stats().completed.load(), 120);
  EXPECT_GT(w1->stats().completed.load(), 0);
  EXPECT_GT(w2->stats().completed.load(), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE status = 'completed' AND attempt = 1"),
            120);
}

TEST(WorkerE2eTest, StopReleasesOrFinishesEverythingItHeld) {
  testing::ApiHarness h;
  ASSERT_TRUE(h.ok());
  DispatcherThread d(h.database_url(), h.redis_url());
  auto texts = random_texts(300, 3);
  json reqs = json::array();
  for (const auto& t : texts) reqs.push_back({{"prompt", "reverse: " + t}, {"temperature", 0}});
  std::string id = h.submit(reqs, h.key_a());
  {
    auto w = make_worker(h, "short-lived");
    ASSERT_TRUE(w->start().is_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    w->stop();  // finishes or releases what it held
  }
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE status = 'running'"), 0);
  auto w = make_worker(h, "finisher");
  ASSERT_TRUE(w->start().is_ok());
  check_answers(wait_done(h, id, 120), texts);
}

// With no time to drain, a stopping worker hands back everything it was running: each request
// once (handed back, not also completed as cancelled), and a second worker answers them all.
TEST(WorkerE2eTest, StopWithoutDrainHandsBackWhatItRan) {
  testing::ApiHarness h;
  ASSERT_TRUE(h.ok());
  DispatcherThread d(h.database_url(), h.redis_url());
  auto texts = random_texts(400, 12);
  json reqs = json::array();
  for (const auto& t : texts) reqs.push_back({{"prompt", "reverse: " + t}, {"temperature", 0}});
  std::string id = h.submit(reqs, h.key_a());
  {
    auto w = make_worker(h, "no-drain", 1.0, /*drain_seconds=*/0);
    ASSERT_TRUE(w->start().is_ok());
    for (int i = 0; i < 600 && w->stats().completed.load() < 20; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GT(h.scalar("SELECT count(*) FROM requests WHERE status = 'running'"), 0);
    w->stop();
    EXPECT_GT(w->stats().released.load(), 0);
  }
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE status = 'running'"), 0);
  auto w = make_worker(h, "finisher");
  ASSERT_TRUE(w->start().is_ok());
  check_answers(wait_done(h, id, 120), texts);
}

// A mixture of experts served from its folder (the Qwen3-MoE fixture of models/fixtures/, random
// weights made by transformers, the byte tokenizer and template of the bundled model): a queued
// batch and sync requests answered exactly as an engine alone answers them.
TEST(WorkerE2eTest, AMixtureOfExpertsFolderIsServedQueuedAndSync) {
  const std::string dir = std::string(HEADROOM_SOURCE_DIR) + "/models/fixtures/qwen3-moe";
  ServedHarness s("moe", [&](WorkerConfig& wc) { wc.model_dir = dir; });
  ASSERT_TRUE(s.ok());
  testing::ApiHarness& h = s.h;
  Worker& w = *s.w;
  const auto texts = random_texts(16, 9);
  json reqs = json::array();
  for (const auto& t : texts) {
    reqs.push_back({{"messages", {{{"role", "user"}, {"content", "reverse: " + t}}}},
                    {"temperature", 0},
                    {"max_tokens", 12}});
  }
  const std::string id = h.submit(reqs, h.key_a());
  ASSERT_FALSE(id.empty());
  const json result = wait_done(h, id, 60);
  ASSERT_TRUE(result.is_object());
  EXPECT_EQ(result["status"], "completed");
  ASSERT_EQ(result["responses"].size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const json& r = result["responses"][i];
    EXPECT_EQ(r["success"], true) << r.dump();
    EXPECT_EQ(r["result"]["response"], greedy_alone(texts[i], {}, dir, 12)) << "request " << i;
  }
  for (size_t i = 0; i < 3; ++i) {
    auto sync = h.post("/v1/chat/completions",
                       json{{"model", h.model()},
                            {"messages", {{{"role", "user"}, {"content", "reverse: " + texts[i]}}}},
                            {"temperature", 0},
                            {"max_tokens", 12}}
                           .dump(),
                       h.key_a());
    ASSERT_EQ(sync.status, 200) << sync.body;
    EXPECT_EQ(sync.json()["choices"][0]["message"]["content"],
              result["responses"][i]["result"]["response"])
        << "request " << i << ": sync and queued answers differ";
  }
  w.stop();
  EXPECT_EQ(w.stats().completed.load(), 16);
}

// The prefix cache is no oracle across accounts: account B's right guess of account A's prompt
// reports as many cached tokens as a wrong one (none), while A's own requests, sync or queued,
// hit what A sent before.
TEST(WorkerE2eTest, CachedPrefixesAreSharedOnlyWithinAnAccount) {
  ServedHarness s;
  ASSERT_TRUE(s.ok());
  testing::ApiHarness& h = s.h;
  Worker& w = *s.w;
  auto cached = [&](const std::string& key, const std::string& text) {
    auto r = h.post("/v1/chat/completions",
                    json{{"model", h.model()},
                         {"messages", {{{"role", "user"}, {"content", "reverse: " + text}}}},
                         {"temperature", 0},
                         {"max_tokens", 4}}
                        .dump(),
                    key);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  };
  const std::string secret = "the vault code is 7f3a91 and the door is north";
  EXPECT_EQ(cached(h.key_a(), secret), 0);
  // B probes: a first wrong guess, then the right one and another wrong one. Each finds only the
  // blocks it shares with B's own earlier probes, the right guess no more than a wrong one.
  EXPECT_EQ(cached(h.key_b(), "the vault code is 000000 and the door is south"), 0);
  const int right = cached(h.key_b(), secret);
  const int wrong = cached(h.key_b(), "the vault code is 111111 and the door is east");
  EXPECT_EQ(right, wrong);
  const int again = cached(h.key_a(), secret);
  EXPECT_GT(again, right);  // within account A, the whole prompt hits
  // Queued requests of the account share its cache too (the same namespace as its sync calls).
  const std::string id =
      h.submit(json::array({{{"messages", {{{"role", "user"}, {"content", "reverse: " + secret}}}},
                             {"temperature", 0},
                             {"max_tokens", 4}}}),
               h.key_a());
  ASSERT_FALSE(id.empty());
  const json result = wait_done(h, id, 60);
  ASSERT_TRUE(result.is_object());
  EXPECT_EQ(result["responses"][0]["result"]["usage"]["prompt_tokens_details"]["cached_tokens"],
            again)
      << result.dump();
  w.stop();
}

TEST(WorkerE2eTest, SyncRequestsAnswerWhileAnAsyncBacklogRuns) {
  ServedHarness s;
  ASSERT_TRUE(s.ok());
  testing::ApiHarness& h = s.h;
  Worker& w = *s.w;
  auto backlog = random_texts(2000, 4);
  json reqs = json::array();
  for (const auto& t : backlog) reqs.push_back({{"prompt", "reverse: " + t}, {"temperature", 0}});
  std::string id = h.submit(reqs, h.key_a());
  ASSERT_FALSE(id.empty());
  // Wait until async work is actually running.
  for (int i = 0; i < 100 && w.stats().pulled.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto texts = random_texts(10, 5);
  for (const auto& t : texts) {
    auto r = h.post("/v1/chat/completions",
                    json{{"model", h.model()},
                         {"messages", {{{"role", "user"}, {"content", "reverse: " + t}}}},
                         {"temperature", 0}}
                        .dump(),
                    h.key_a());
    ASSERT_EQ(r.status, 200) << r.body;
    json j = r.json();
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["choices"][0]["message"]["content"], greedy_alone(t));
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
    auto cf = h.post("/ai/run/" + h.model(),
                     json{{"prompt", "reverse: " + t}, {"temperature", 0}}.dump(), h.key_a());
    ASSERT_EQ(cf.status, 200) << cf.body;
    EXPECT_EQ(cf.json()["result"]["response"], greedy_alone(t));
  }
  // Penalties reach the engine (the answer is the penalized one, and not the plain one); content
  // as OpenAI's text parts.
  const engine::Penalties penalties{1.5f, 1.0f, 1.4f};
  const std::string repetitive = "bookkeeper committee";
  const std::string penalized = greedy_alone(repetitive, penalties);
  ASSERT_NE(penalized, greedy_alone(repetitive));
  auto pen =
      h.post("/v1/chat/completions",
             json{{"model", h.model()},
                  {"messages",
                   {{{"role", "user"},
                     {"content", {{{"type", "text"}, {"text", "reverse: " + repetitive}}}}}}},
                  {"temperature", 0},
                  {"frequency_penalty", 1.5},
                  {"presence_penalty", 1.0},
                  {"repetition_penalty", 1.4}}
                 .dump(),
             h.key_a());
  ASSERT_EQ(pen.status, 200) << pen.body;
  EXPECT_EQ(pen.json()["choices"][0]["message"]["content"], penalized);
  // Log probabilities: in the choice for OpenAI's shape, in the result for Workers AI's; not with
  // a stream.
  auto lp = h.post("/v1/chat/completions",
                   json{{"model", h.model()},
                        {"messages", {{{"role", "user"}, {"content", "reverse: logprobs"}}}},
                        {"temperature", 0},
                        {"logprobs", true},
                        {"top_logprobs", 3}}
                       .dump(),
                   h.key_a());
  ASSERT_EQ(lp.status, 200) << lp.body;
  EXPECT_EQ(lp.json()["choices"][0]["message"]["content"], greedy_alone("logprobs"));
  check_logprobs(lp.json()["choices"][0]["logprobs"], greedy_alone("logprobs"), 3,
                 lp.json()["usage"]["completion_tokens"]);
  // logit_bias reaches the engine: +100 on "z" makes every token "z"; an id past the vocabulary
  // is refused, naming it.
  auto tok = engine::Tokenizer::load(kModelDir);
  ASSERT_TRUE(tok.is_ok());
  const std::string z = std::to_string((*tok)->encode("z")[0]);
  auto biased = h.post("/v1/chat/completions",
                       json{{"model", h.model()},
                            {"messages", {{{"role", "user"}, {"content", "reverse: abc"}}}},
                            {"max_tokens", 5},
                            {"logit_bias", {{z, 100}}}}
                           .dump(),
                       h.key_a());
  ASSERT_EQ(biased.status, 200) << biased.body;
  EXPECT_EQ(biased.json()["choices"][0]["message"]["content"], "zzzzz");
  auto past = h.post("/v1/chat/completions",
                     json{{"model", h.model()},
                          {"messages", {{{"role", "user"}, {"content", "x"}}}},
                          {"logit_bias", {{"100000", 5}}}}
                         .dump(),
                     h.key_a());
  EXPECT_EQ(past.status, 400) << past.body;
  EXPECT_EQ(past.json()["error"]["param"], "logit_bias.100000") << past.body;
  // A stop string cuts the answer, and the entries of the tokens it held back go with it.
  const std::string full = greedy_alone("abcdef");
  ASSERT_NE(full.find("dc"), std::string::npos) << full;
  auto stopped = h.post("/v1/chat/completions",
                        json{{"model", h.model()},
                             {"messages", {{{"role", "user"}, {"content", "reverse: abcdef"}}}},
                             {"temperature", 0},
                             {"logprobs", true},
                             {"stop", "dc"}}
                            .dump(),
                        h.key_a());
  ASSERT_EQ(stopped.status, 200) << stopped.body;
  const json stopped_body = stopped.json();
  const json& choice = stopped_body["choices"][0];
  EXPECT_EQ(choice["message"]["content"], full.substr(0, full.find("dc")));
  std::string joined;
  for (const json& e : choice["logprobs"]["content"]) joined += e["token"].get<std::string>();
  EXPECT_EQ(joined, choice["message"]["content"]) << stopped.body;
  auto cf_lp =
      h.post("/ai/run/" + h.model(),
             json{{"prompt", "reverse: logprobs"}, {"temperature", 0}, {"logprobs", true}}.dump(),
             h.key_a());
  ASSERT_EQ(cf_lp.status, 200) << cf_lp.body;
  check_logprobs(cf_lp.json()["result"]["logprobs"], greedy_alone("logprobs"), 0,
                 cf_lp.json()["result"]["usage"]["completion_tokens"]);
  // Streamed, each chunk carries the entries of the tokens its text brings; a stop string's cut
  // leaves none behind.
  auto streamed_lp = h.post("/v1/chat/completions",
                            json{{"model", h.model()},
                                 {"messages", {{{"role", "user"}, {"content", "reverse: abcdef"}}}},
                                 {"temperature", 0},
                                 {"stream", true},
                                 {"logprobs", true},
                                 {"top_logprobs", 2},
                                 {"stop", "dc"}}
                                .dump(),
                            h.key_a());
  ASSERT_EQ(streamed_lp.status, 200) << streamed_lp.body;
  std::string streamed_text, streamed_tokens;
  int chunks_with_text = 0;
  for (const json& chunk : sse_events(streamed_lp.body)) {
    if (chunk["choices"].empty()) continue;
    const json& c = chunk["choices"][0];
    const std::string piece = c["delta"].value("content", "");
    if (piece.empty()) continue;
    ++chunks_with_text;
    streamed_text += piece;
    std::string tokens;
    for (const json& e : c["logprobs"]["content"]) {
      tokens += e["token"].get<std::string>();
      EXPECT_EQ(e["top_logprobs"].size(), 2u);
    }
    EXPECT_EQ(tokens, piece) << chunk.dump();
    streamed_tokens += tokens;
  }
  EXPECT_GT(chunks_with_text, 0);
  EXPECT_EQ(streamed_text, full.substr(0, full.find("dc")));
  EXPECT_EQ(streamed_tokens, streamed_text);
  auto plain = h.post(
      "/v1/chat/completions",
      json{{"model", h.model()}, {"messages", {{{"role", "user"}, {"content", "reverse: x"}}}}}
          .dump(),
      h.key_a());
  EXPECT_TRUE(plain.json()["choices"][0]["logprobs"].is_null()) << plain.body;
  // The backlog was still running while sync requests were answered.
  json progress = h.get("/v1/async/" + id, h.key_a()).json()["result"];
  EXPECT_NE(progress["status"], "completed");
  auto models = h.get("/v1/models", h.key_a());
  EXPECT_EQ(models.json()["data"][0]["id"], h.model());
  // Streaming: server-sent chat.completion.chunk events whose deltas add up to the answer.
  std::string t = texts[0];
  auto stream = h.post("/v1/chat/completions",
                       json{{"model", h.model()},
                            {"messages", {{{"role", "user"}, {"content", "reverse: " + t}}}},
                            {"temperature", 0},
                            {"stream", true},
                            {"stream_options", {{"include_usage", true}}}}
                           .dump(),
                       h.key_a());
  ASSERT_EQ(stream.status, 200) << stream.body;
  EXPECT_EQ(stream.headers["Content-Type"], "text/event-stream");
  std::string text;
  int events = 0;
  bool done = false, usage = false;
  std::string finish;
  for (size_t pos = 0; (pos = stream.body.find("data: ", pos)) != std::string::npos;) {
    size_t end = stream.body.find("\n\n", pos);
    std::string data = stream.body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    json chunk = json::parse(data);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    ++events;
    if (!chunk["choices"].empty()) {
      text += chunk["choices"][0]["delta"].value("content", "");
      if (chunk["choices"][0]["finish_reason"].is_string())
        finish = chunk["choices"][0]["finish_reason"];
    }
    if (chunk.contains("usage")) usage = chunk["usage"]["completion_tokens"].get<int>() > 0;
  }
  EXPECT_TRUE(done);
  EXPECT_TRUE(usage);
  EXPECT_EQ(finish, "stop");
  EXPECT_GT(events, 3);
  EXPECT_EQ(text, greedy_alone(t));
  // The Workers-AI shape streams too: {"response": delta} events, then the usage, then [DONE].
  auto cf_stream = h.post(
      "/ai/run/" + h.model(),
      json{{"prompt", "reverse: " + t}, {"temperature", 0}, {"stream", true}}.dump(), h.key_a());
  ASSERT_EQ(cf_stream.status, 200) << cf_stream.body;
  EXPECT_EQ(cf_stream.headers["Content-Type"], "text/event-stream");
  std::string cf_text;
  json last;
  bool cf_done = false;
  int cf_events = 0;
  for (size_t pos = 0; (pos = cf_stream.body.find("data: ", pos)) != std::string::npos;) {
    size_t end = cf_stream.body.find("\n\n", pos);
    std::string data = cf_stream.body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") {
      cf_done = true;
      continue;
    }
    last = json::parse(data);
    cf_text += last["response"].get<std::string>();
    ++cf_events;
  }
  EXPECT_TRUE(cf_done);
  EXPECT_GT(cf_events, 3);
  EXPECT_EQ(cf_text, greedy_alone(t));
  EXPECT_GT(last["usage"]["completion_tokens"].get<int>(), 0);
  EXPECT_EQ(last["finish_reason"], "stop");
  auto bad_stream =
      h.post("/ai/run/" + h.model(), json{{"stream", true}, {"prompt", 5}}.dump(), h.key_a());
  EXPECT_EQ(bad_stream.status, 400) << bad_stream.body;
  EXPECT_EQ(
      h.post("/ai/run/" + h.model(), json{{"stream", true}, {"prompt", "x"}}.dump(), "").status,
      401);
  // Prometheus metrics (no key needed) saw all of this.
  auto m = testing::http_call("GET", h.port(), "/metrics");
  ASSERT_EQ(m.status, 200);
  auto value = [&](const std::string& series) {
    size_t p = m.body.find("\n" + series + " ");
    if (p == std::string::npos) return -1.0;
    return std::stod(m.body.substr(p + series.size() + 2));
  };
  EXPECT_GE(value("headroom_time_to_first_token_seconds_count{class=\"sync\"}"), 21);
  EXPECT_GE(value("headroom_e2e_latency_seconds_count{class=\"sync\"}"), 21);
  EXPECT_GT(value("headroom_inter_token_latency_seconds_count{class=\"sync\"}"), 0);
  EXPECT_GT(value("headroom_generation_tokens_total{class=\"sync\"}"), 0);
  EXPECT_GT(value("headroom_async_pulled_total"), 0);
  EXPECT_GT(value("headroom_engine_step_seconds_count"), 0);
  EXPECT_GT(value("headroom_engine_step_seconds_sum"), 0);
  EXPECT_GT(value("headroom_async_credits_granted_total"), 0);
  EXPECT_GT(value("headroom_queue_time_seconds_count{class=\"async\"}"), 0);
  EXPECT_GT(value("headroom_kv_cache_blocks_total"), 0);
  EXPECT_GE(value("headroom_prefix_cache_queries_total"), 0);
  EXPECT_GT(value("headroom_async_pending_requests{model=\"" + h.model() + "\"}"), 0);
  EXPECT_GE(value("headroom_http_requests_total{route=\"/v1/chat/completions\",code=\"200\"}"), 11);
  EXPECT_NE(m.headers["Content-Type"].find("text/plain"), std::string::npos);
  h.api().set_sync_inference(nullptr);
  w.stop();
}

// A sync call through the API (account A): "reverse: " + text.
auto sync_reverse(testing::ApiHarness& h, const std::string& text) {
  return h.post("/v1/chat/completions",
                json{{"model", h.model()},
                     {"messages", {{{"role", "user"}, {"content", "reverse: " + text}}}}}
                    .dump(),
                h.key_a());
}

// The CPU backend, until told to break: then every step fails, as on a GPU whose context is lost.
class BreakableBackend final : public engine::Backend {
 public:
  explicit BreakableBackend(std::shared_ptr<engine::Backend> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return inner_->name(); }
  int vocab_size() const override { return inner_->vocab_size(); }
  int block_size() const override { return inner_->block_size(); }
  int num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  size_t weight_bytes() const override { return inner_->weight_bytes(); }
  size_t kv_cache_bytes() const override { return inner_->kv_cache_bytes(); }
  Status forward(const engine::StepInput& in, float* logits) override {
    return inner_->forward(in, logits);
  }
  Status submit(const engine::StepInput& in, const engine::SampleSpec* specs) override {
    if (broken) return failure;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.empty()) return internal_error("the ranks were aborted: " + aborted_);
    }
    return inner_->submit(in, specs);
  }
  Status collect(int32_t* tokens, engine::TokenLogprobs* logprobs) override {
    if (hang) {
      // A step that never completes (a rank waiting for a peer that never comes), until abort()
      // ends the wait (when abortable) or the test releases it.
      std::unique_lock<std::mutex> lock(mu_);
      hanging = true;
      cv_.wait(lock, [&] { return !aborted_.empty() || released_; });
      hanging = false;
      if (!aborted_.empty()) return internal_error("the ranks were aborted: " + aborted_);
    }
    return inner_->collect(tokens, logprobs);
  }
  void discard() override { inner_->discard(); }
  bool abort(const std::string& reason) override {
    ++aborts;
    if (abort_hangs) {
      // An abort that itself never returns (ncclCommAbort on a wedged device), until released.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return released_; });
      return false;
    }
    if (!abortable) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted_ = reason;
    }
    cv_.notify_all();
    return true;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }
  std::atomic<bool> broken{false};
  Status failure =
      internal_error("an illegal memory access was encountered");  // set before breaking
  std::atomic<bool> hang{false};
  std::atomic<bool> hanging{false};  // a collect() waits in the hang
  bool abortable = true;             // set before hanging
  bool abort_hangs = false;          // ... and this
  std::atomic<int> aborts{0};

 private:
  std::shared_ptr<engine::Backend> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string aborted_;  // guarded by mu_
  bool released_ = false;
};

std::shared_ptr<BreakableBackend> breakable_backend() {
  engine::ModelWeights weights = engine::load_weights(kModelDir).value();
  engine::pack_for_cpu(&weights);
  auto cpu = engine::CpuBackend::create(
      std::make_shared<const engine::ModelWeights>(std::move(weights)), {16, 16 << 20, 1});
  EXPECT_TRUE(cpu.is_ok());
  return std::make_shared<BreakableBackend>(
      std::shared_ptr<engine::Backend>(std::move(cpu).value()));
}

// Submits `n` reversals (their texts in `texts`) and waits until worker `w` has completed 20 of
// them; the batch's id, or "" when that did not happen.
std::string submit_under_way(testing::ApiHarness& h, const Worker& w, int n, int seed,
                             std::vector<std::string>* texts) {
  *texts = random_texts(n, seed);
  json reqs = json::array();
  for (const auto& t : *texts) reqs.push_back({{"prompt", "reverse: " + t}, {"temperature", 0}});
  std::string id = h.submit(reqs, h.key_a());
  for (int i = 0; i < 600 && w.stats().completed.load() < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return w.stats().completed.load() >= 20 ? id : "";
}

// rejectIfBusy: of many sync requests arriving at once, the worker takes as many as it has slots
// and refuses the rest at once; none of them waits in the engine for a slot.
TEST(WorkerE2eTest, RejectIfBusyAdmitsNoMoreThanTheWorkerHasSlotsFor) {
  testing::ApiHarness h;
  ASSERT_TRUE(h.ok());
  constexpr int kSlots = 2;
  constexpr int kCallers = 16;
  auto w = make_worker(h, "w", 1.0, 5, nullptr, [](WorkerConfig& c) { c.max_num_seqs = kSlots; });
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->start().is_ok());
  const wire::ChatRequest request =
      wire::chat_request_from_json(
          {{"messages", {{{"role", "user"}, {"content", "reverse: busy"}}}}, {"max_tokens", 200}})
          .value();
  SyncOptions call;
  call.reject_if_busy = true;
  for (int round = 0; round < 50; ++round) {
    std::vector<std::unique_ptr<wire::AnswerStream>> streams(kCallers);
    std::vector<Status> refused(kCallers);
    std::atomic<int> ready{0};
    std::vector<std::thread> callers;
    for (int i = 0; i < kCallers; ++i) {
      callers.emplace_back([&, i] {
        ++ready;
        while (ready.load() < kCallers) std::this_thread::yield();
        auto s = w->start_stream(request, call);
        if (s.is_ok())
          streams[i] = std::move(s).value();
        else
          refused[i] = s.status();
      });
    }
    for (auto& t : callers) t.join();
    int admitted = 0;
    for (int i = 0; i < kCallers; ++i) {
      if (streams[i]) {
        ++admitted;
      } else {
        EXPECT_EQ(refused[i].code(), StatusCode::kResourceExhausted) << refused[i].to_string();
      }
    }
    ASSERT_EQ(admitted, kSlots) << "round " << round;
    EXPECT_EQ(w->load().sync_load, kSlots);
    streams.clear();  // the clients leave: their slots are free at once
    EXPECT_EQ(w->load().sync_load, 0);
  }
}

// A worker that is draining refuses sync calls saying that another worker may take them, so that
// the router hands them on even with rejectIfBusy; a worker that is only full does not say so.
TEST(WorkerE2eTest, ADrainingWorkerTellsTheRouterToTryElsewhere) {
  testing::ApiHarness h;
  ASSERT_TRUE(h.ok());
  auto w = make_worker(h, "w", 1.0, 5, nullptr, [](WorkerConfig& c) { c.max_num_seqs = 1; });
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->start().is_ok());
  SyncServer server(*w, {});
  ASSERT_TRUE(server.start().is_ok());
  const int port = std::stoi(server.url().substr(server.url().rfind(':') + 1));
  auto call = [&](int max_tokens) {
    const json body = {{"request",
                        {{"messages", {{{"role", "user"}, {"content", "reverse: drain"}}}},
                         {"max_tokens", max_tokens},
                         {"temperature", 0}}},
                       {"reject_if_busy", true}};
    return testing::http_call("POST", port, "/internal/sync", body.dump());
  };
  auto ok = call(8);
  ASSERT_EQ(ok.status, 200) << ok.body;
  // Full: its one slot held by a stream.
  SyncOptions sc;
  sc.reject_if_busy = true;
  auto held = w->start_stream(
      wire::chat_request_from_json(
          {{"messages", {{{"role", "user"}, {"content", "reverse: held"}}}}, {"max_tokens", 200}})
          .value(),
      sc);
  ASSERT_TRUE(held.is_ok());
  auto full = call(8);
  EXPECT_EQ(full.status, 429) << full.body;
  EXPECT_FALSE(full.json()["error"].contains("retry_elsewhere")) << full.body;
  held = Status(StatusCode::kCancelled, "");  // the stream's client leaves
  w->begin_drain();
  auto draining = call(8);
  EXPECT_EQ(draining.status, 429) << draining.body;
  EXPECT_EQ(draining.json()["error"]["retry_elsewhere"], true) << draining.body;
  server.stop();
  w->stop();
}

// An engine that keeps failing: the worker ends what it held (async requests back to the queue as
// retryable failures, sync calls answered with an error rather than left waiting), stops, and
// says so once; a healthy worker then finishes the whole batch correctly.
TEST(WorkerE2eTest, AWorkerWhoseEngineKeepsFailingHandsItsWorkBackAndStops) {
  testing::ApiHarness h;
  ASSERT_TRUE(h.ok());
  DispatcherThread d(h.database_url(), h.redis_url());
  auto backend = breakable_backend();
  auto w = make_worker(h, "failing", 1.0, 5, backend);
  ASSERT_TRUE(w);
  std::atomic<int> failures{0};
  w->set_on_failure([&] { ++failures; });
  cmd::WorkerSync worker_sync(*w);
  testing::ScopedSyncSide sync_side(h.api(), &worker_sync);
  ASSERT_TRUE(w->start().is_ok());
  std::vector<std::string> texts;
  const std::string id = submit_under_way(h, *w, 400, 9, &texts);
  ASSERT_FALSE(id.empty());
  ASSERT_GT(h.scalar("SELECT count(*) FROM requests WHERE status = 'running'"), 0);
  backend->broken = true;
  // A sync call now gets an error (it ended in the failing engine, or the worker is stopping),
  // not a wait.
  auto sync = sync_reverse(h, "abc");
  EXPECT_TRUE(sync.status >= 500 || sync.status == 429) << sync.status << " " << sync.body;
  for (int i = 0; i < 500 && !w->failed(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(w->failed());
  w->stop();  // the loop has ended already: returns at once
  EXPECT_EQ(failures.load(), 1);
  // Nothing stays leased to the failed worker: what it ran went back to the queue.
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE status = 'running'"), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE status = 'failed'"), 0);
  EXPECT_GT(h.scalar("SELECT count(*) FROM requests WHERE status = 'queued' AND num_failures >= 1"),
            0);
  auto healthy = make_worker(h, "healthy");
  ASSERT_TRUE(healthy);
  ASSERT_TRUE(healthy->start().is_ok());
  check_answers(wait_done(h, id, 180), texts);
  healthy->stop();
}

// Steps failing for a reason of the work, not the device (kInvalidArgument here): the worker ends
// what it held (async requests back to the queue), keeps its engine and goes on; once the steps
// pass again it finishes the whole batch itself.
TEST(WorkerE2eTest, AWorkerWhoseStepsFailForTheWorkGoesOnWithACleanEngine) {
  testing::ApiHarness h;
  ASSERT_TRUE(h.ok());
  DispatcherThread d(h.database_url(), h.redis_url());
  auto backend = breakable_backend();
  backend->failure = invalid_argument("block 99999 is outside the KV cache");
  auto w = make_worker(h, "recovering", 1.0, 5, backend);
  ASSERT_TRUE(w);
  std::atomic<int> failures{0};
  w->set_on_failure([&] { ++failures; });
  ASSERT_TRUE(w->start().is_ok());
  std::vector<std::string> texts;
  const std::string id = submit_under_way(h, *w, 300, 11, &texts);
  ASSERT_FALSE(id.empty());
  backend->broken = true;
  // What it held went back to the queue as failed attempts.
  for (int i = 0; i < 500 && h.scalar("SELECT count(*) FROM requests WHERE num_failures >= 1") == 0;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(h.scalar("SELECT count(*) FROM requests WHERE num_failures >= 1"), 0);
  backend->broken = false;
  check_answers(wait_done(h, id, 180), texts);
  EXPECT_FALSE(w->failed());
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE status = 'failed'"), 0);
  w->stop();
}

// A worker whose step gets stuck (BreakableBackend::hang) past a 1 s --step-timeout-seconds, with
// a batch under way and the API's sync side on it: after get_stuck(), the watchdog has fired, and
// the sync calls posted while the step hung (through the API, and to the worker's sync port) have
// been answered (an error: the watchdog's, not the call's own two-minute deadline; over the sync
// port one that lets the router try another worker).
struct StuckWorker {
  explicit StuckWorker(bool abortable, int seed, bool abort_hangs = false)
      : d(h.database_url(), h.redis_url()) {
    backend->abortable = abortable;
    backend->abort_hangs = abort_hangs;
    w = make_worker(h, abortable ? "stuck" : "wedged", 1.0, 5, backend,
                    [](WorkerConfig& c) { c.step_timeout_seconds = 1; });
    if (!w) return;
    w->set_on_failure([this] { ++failures; });
    worker_sync = std::make_unique<cmd::WorkerSync>(*w);
    sync_side = std::make_unique<testing::ScopedSyncSide>(h.api(), worker_sync.get());
    if (w->start().is_ok()) id = submit_under_way(h, *w, 300, seed, &texts);
  }
  // Stopping leaves the stuck loop's thread after a grace, rather than wait for ever; the loop's
  // thread still uses the worker (whose destructor would end the process): the worker is kept,
  // and the step released so that the thread ends.
  void stop_leaving_the_loop() {
    const auto stopping = std::chrono::steady_clock::now();
    w->stop();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - stopping).count(),
              20.0);
    EXPECT_TRUE(w->loop_abandoned());
    EXPECT_EQ(failures.load(), 1);
    backend->release();
    (void)w.release();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  void get_stuck() {
    ASSERT_FALSE(id.empty());
    backend->hang = true;
    for (int i = 0; i < 500 && !backend->hanging; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(backend->hanging);
    const auto posted = std::chrono::steady_clock::now();
    // One call through the API, one straight to the worker's sync port (as the API's router of a
    // standalone worker sends it), both waiting in the stuck worker.
    auto direct = std::async(std::launch::async, [this] {
      SyncServer server(*w, {});
      if (!server.start().is_ok()) return testing::HttpResult{};
      const int port = std::stoi(server.url().substr(server.url().rfind(':') + 1));
      const json body = {
          {"request", {{"messages", {{{"role", "user"}, {"content", "reverse: xyz"}}}}}}};
      return testing::http_call("POST", port, "/internal/sync", body.dump());
    });
    auto sync = sync_reverse(h, "abc");
    EXPECT_TRUE(sync.status >= 500 || sync.status == 429) << sync.status << " " << sync.body;
    const testing::HttpResult refused = direct.get();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - posted).count(),
              10.0);
    // The router may take it to another worker: nothing of its answer left this one.
    EXPECT_GE(refused.status, 429) << refused.body;
    EXPECT_EQ(refused.json()["error"]["retry_elsewhere"], true) << refused.body;
    // (The failure is reported, then the ranks aborted.)
    for (int i = 0; i < 800 && (failures.load() == 0 || backend->aborts.load() == 0); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(failures.load(), 1);
    EXPECT_TRUE(w->stuck());
    EXPECT_EQ(backend->aborts.load(), 1);
    // The leases were handed back before the failure was reported.
    EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE status = 'running'"), 0);
    EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE status = 'failed'"), 0);
    EXPECT_GT(
        h.scalar("SELECT count(*) FROM requests WHERE status = 'queued' AND num_failures >= 1"), 0);
  }

  testing::ApiHarness h;
  DispatcherThread d;
  std::shared_ptr<BreakableBackend> backend = breakable_backend();
  std::atomic<int> failures{0};  // (outlives the worker, whose failure counts here)
  std::unique_ptr<Worker> w;
  std::unique_ptr<cmd::WorkerSync> worker_sync;
  std::unique_ptr<testing::ScopedSyncSide> sync_side;
  std::vector<std::string> texts;
  std::string id;
};

// A step that never returns (a rank of a parallel engine waiting for a peer that never comes):
// past --step-timeout-seconds the watchdog hands everything back without the stuck step loop.
// The sync call waiting in the inbox gets an error at once rather than after its own deadline,
// the running requests go back to the queue as retryable failures, the backend's ranks are
// aborted (which here ends the step), the worker fails once and stops, and a healthy worker
// finishes the whole batch.
TEST(WorkerE2eTest, AStuckStepHandsTheWorkBackAndTheAbortEndsIt) {
  StuckWorker s(/*abortable=*/true, 13);
  ASSERT_TRUE(s.h.ok() && s.w);
  s.get_stuck();
  s.w->stop();  // the abort ended the step: the loop has ended
  EXPECT_FALSE(s.w->loop_abandoned());
  EXPECT_EQ(s.failures.load(), 1);
  auto healthy = make_worker(s.h, "healthy");
  ASSERT_TRUE(healthy);
  ASSERT_TRUE(healthy->start().is_ok());
  check_answers(wait_done(s.h, s.id, 180), s.texts);
  healthy->stop();
}

// A stuck step that no abort can end (one device wedged): the work goes back all the same, a sync
// call waiting in the inbox is answered from the watchdog's thread, the worker reports its
// failure while its loop is still stuck, and stop() returns, leaving the loop's thread, so that
// the process can exit.
TEST(WorkerE2eTest, AStepThatStaysStuckStillHandsTheWorkBack) {
  StuckWorker s(/*abortable=*/false, 17);
  ASSERT_TRUE(s.h.ok() && s.w);
  s.get_stuck();
  EXPECT_TRUE(s.backend->hanging);  // still stuck
  // Nothing new goes to it: sync calls are refused at once.
  const wire::ChatRequest request =
      wire::chat_request_from_json({{"messages", {{{"role", "user"}, {"content", "reverse: x"}}}}})
          .value();
  EXPECT_FALSE(s.w->run(request, SyncOptions{}).is_ok());
  s.stop_leaving_the_loop();
}

// An abort that itself hangs (ncclCommAbort on a wedged device) holds nothing up: the work has
// gone back and the failure is reported before it, and stop() leaves the stuck loop's thread.
TEST(WorkerE2eTest, AnAbortThatHangsStillReportsTheFailure) {
  StuckWorker s(/*abortable=*/true, 19, /*abort_hangs=*/true);
  ASSERT_TRUE(s.h.ok() && s.w);
  s.get_stuck();
  s.stop_leaving_the_loop();  // (released: the abort, then the step, return)
}

}  // namespace
}  // namespace hr::workers
