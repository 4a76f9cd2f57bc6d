// The async API over real HTTP, Postgres and Redis: round trips, validation (nothing written for a
// rejected batch), idempotency, tenancy and a 100,000-request batch.
#include "api/api.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <pqxx/pqxx>
#include <thread>

#include "queue/dispatcher.h"
#include "queue/lease.h"
#include "queue/store.h"
#include "tests/testing/api_harness.h"
#include "tests/testing/http_client.h"
#include "wire/answer_stream.h"

namespace hr::api {
namespace {

using nlohmann::json;
using testing::ApiHarness;
using testing::ScopedSyncSide;

json reversal(const std::string& text) {
  return {{"messages", {{{"role", "user"}, {"content", "reverse: " + text}}}}, {"max_tokens", 40}};
}

// Sync inference that answers every call with two tool calls (and, streamed, the text "Let me
// look." first), as a model that calls tools would.
class ToolCallingSync final : public SyncInference {
 public:
  static wire::Answer answer() {
    wire::Answer a;
    a.text = "Let me look.";
    a.finish_reason = "tool_calls";
    a.usage = {10, 5, 0};
    a.tool_calls = {{"call_a", "get_weather", R"({"city":"Oslo"})"}, {"call_b", "get_time", "{}"}};
    return a;
  }
  Result<SyncAnswer> run(const wire::ChatRequest&, const SyncCall&) override {
    return SyncAnswer{answer(), ""};
  }
  Result<std::unique_ptr<wire::AnswerStream>> start_stream(const wire::ChatRequest&,
                                                           const SyncCall&) override {
    class Stream final : public wire::AnswerStream {
     public:
      bool next(std::string* delta) override {
        if (sent_) return false;
        sent_ = true;
        *delta = "Let me look.";
        return true;
      }
      const wire::Logprobs& delta_logprobs() const override { return none_; }
      const Status& status() const override { return status_; }
      const wire::Answer& answer() const override { return answer_; }

     private:
      bool sent_ = false;
      wire::Logprobs none_;
      Status status_;
      wire::Answer answer_ = ToolCallingSync::answer();
    };
    return std::unique_ptr<wire::AnswerStream>(new Stream());
  }
};

// Tool calls in every sync shape: OpenAI's message and stream chunks (id and name first, then
// the arguments), and Workers AI's result and last event.
TEST(ApiTest, ToolCallsGoOutInEveryShape) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  ToolCallingSync sync;
  ScopedSyncSide sync_side(h.api(), &sync);
  const json tools = {{{"type", "function"}, {"function", {{"name", "get_weather"}}}},
                      {{"type", "function"}, {"function", {{"name", "get_time"}}}}};
  json body = {{"model", h.model()},
               {"messages", {{{"role", "user"}, {"content", "weather?"}}}},
               {"tools", tools}};
  auto plain = h.post("/v1/chat/completions", body.dump(), h.key_a());
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json answer = plain.json();
  const json& msg = answer["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "Let me look.");
  ASSERT_EQ(msg["tool_calls"].size(), 2u);
  EXPECT_EQ(msg["tool_calls"][0]["id"], "call_a");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"city":"Oslo"})");
  EXPECT_EQ(answer["choices"][0]["finish_reason"], "tool_calls");

  body["stream"] = true;
  auto streamed = h.post("/v1/chat/completions", body.dump(), h.key_a());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::vector<json> calls(2, json::object());
  std::string text, finish;
  for (size_t at = streamed.body.find("data: {"); at != std::string::npos;
       at = streamed.body.find("data: {", at + 1)) {
    const json chunk =
        json::parse(streamed.body.substr(at + 6, streamed.body.find("\n", at) - at - 6));
    if (chunk["choices"].empty()) continue;
    const json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null())
      finish = chunk["choices"][0]["finish_reason"];
    if (!delta.contains("tool_calls")) continue;
    const json& d = delta["tool_calls"][0];
    json& call = calls.at(d["index"].get<size_t>());
    // The SDKs' reassembly: id, type and name once, arguments appended.
    if (d.contains("id")) {
      call["id"] = d["id"];
      call["name"] = d["function"]["name"];
    }
    call["arguments"] = call.value("arguments", "") + d["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(text, "Let me look.");
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_EQ(calls[0],
            (json{{"id", "call_a"}, {"name", "get_weather"}, {"arguments", R"({"city":"Oslo"})"}}));
  EXPECT_EQ(calls[1], (json{{"id", "call_b"}, {"name", "get_time"}, {"arguments", "{}"}}));

  json run = {{"messages", {{{"role", "user"}, {"content", "weather?"}}}}, {"tools", tools}};
  auto result = h.post("/ai/run/" + h.model(), run.dump(), h.key_a());
  ASSERT_EQ(result.status, 200) << result.body;
  EXPECT_EQ(result.json()["result"]["tool_calls"][0],
            (json{{"name", "get_weather"}, {"arguments", {{"city", "Oslo"}}}}));
  run["stream"] = true;
  auto run_stream = h.post("/ai/run/" + h.model(), run.dump(), h.key_a());
  ASSERT_EQ(run_stream.status, 200) << run_stream.body;
  const size_t last = run_stream.body.rfind("data: {");
  const json final_event =
      json::parse(run_stream.body.substr(last + 6, run_stream.body.find("\n", last) - last - 6));
  EXPECT_EQ(final_event["finish_reason"], "tool_calls");
  EXPECT_EQ(final_event["tool_calls"][1]["name"], "get_time");
}

TEST(ApiTest, HealthNeedsNoKey) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(testing::http_call("GET", h.port(), "/healthz").status, 200);
  auto ready = testing::http_call("GET", h.port(), "/readyz");
  EXPECT_EQ(ready.status, 200) << ready.body;
  EXPECT_EQ(ready.json()["checks"]["postgres"], "ok");
  EXPECT_EQ(ready.json()["checks"]["redis"], "ok");
}

// /readyz answers anyone: with Redis out of reach it says so, without the host and port its error
// names (those go to the log).
TEST(ApiTest, ReadyzTellsWhatIsDownNotWhere) {
  ApiHarness base;
  ASSERT_TRUE(base.ok());
  ApiHarness h(base.database_url(), "redis://127.0.0.1:9/0");  // the discard port: nothing there
  ASSERT_TRUE(h.ok());
  auto ready = testing::http_call("GET", h.port(), "/readyz");
  EXPECT_EQ(ready.status, 503) << ready.body;
  EXPECT_EQ(ready.json()["checks"]["redis"], "unavailable") << ready.body;
  EXPECT_EQ(ready.json()["checks"]["postgres"], "ok") << ready.body;
  EXPECT_EQ(ready.body.find("127.0.0.1"), std::string::npos) << ready.body;
  EXPECT_EQ(ready.body.find(":9"), std::string::npos) << ready.body;
}

// /readyz and /metrics answer anyone: however many ask at once, they hold at most one of the API's
// database connections between them.
TEST(ApiTest, ProbesWithoutAKeyShareOneDatabaseConnection) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  const std::string connections =
      "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
      "AND pid <> pg_backend_pid() AND backend_type = 'client backend'";  // (not autovacuum)
  ASSERT_EQ(testing::http_call("GET", h.port(), "/readyz").status, 200);
  // The API's own connections settled first: the load sampler's thread opens one as it starts,
  // which under load can come after the first count (3 against 2). The count is read until two
  // reads 300 ms apart agree.
  int64_t before = h.scalar(connections);
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const int64_t now = h.scalar(connections);
    if (now == before) break;
    before = now;
  }
  std::vector<std::thread> probes;
  std::atomic<int> answered{0};
  for (int t = 0; t < 12; ++t) {
    probes.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        auto r = testing::http_call("GET", h.port(), t % 2 ? "/readyz" : "/metrics");
        answered += r.status == 200 ? 1 : 0;
      }
    });
  }
  for (auto& t : probes) t.join();
  EXPECT_EQ(answered.load(), 240);
  EXPECT_EQ(h.scalar(connections), before);
  auto m = testing::http_call("GET", h.port(), "/metrics");
  EXPECT_NE(m.body.find("headroom_metrics_database_up 1"), std::string::npos) << m.body;
}

TEST(ApiTest, SubmitPollListCancelRoundTrip) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  auto r = h.post("/ai/run/" + h.model() + "?queueRequest=true",
                  json{{"requests", {reversal("abc"), reversal("hello"), reversal("x")}}}.dump(),
                  h.key_a());
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json();
  EXPECT_EQ(j["success"], true);
  EXPECT_EQ(j["result"]["status"], "queued");
  EXPECT_EQ(j["result"]["model"], h.model());
  std::string id = j["result"]["request_id"];
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests"), 3);

  // Poll in the Cloudflare shape and by GET.
  auto p = h.post("/ai/run/" + h.model(), json{{"request_id", id}}.dump(), h.key_a());
  ASSERT_EQ(p.status, 200) << p.body;
  EXPECT_EQ(p.json()["result"]["status"], "queued");
  EXPECT_EQ(p.json()["result"]["progress"]["total"], 3);
  EXPECT_FALSE(p.json()["result"].contains("responses"));
  auto g = h.get("/v1/async/" + id, h.key_a());
  ASSERT_EQ(g.status, 200);
  EXPECT_EQ(g.json()["result"]["request_id"], id);
  auto partial = h.get("/v1/async/" + id + "?include=partial", h.key_a());
  ASSERT_EQ(partial.json()["result"]["responses"].size(), 3u);
  EXPECT_EQ(partial.json()["result"]["responses"][2]["status"], "queued");

  // queueRequest in the body and in options work too.
  auto body_flag =
      h.post("/ai/run/" + h.model(),
             json{{"queueRequest", true}, {"requests", {reversal("q")}}}.dump(), h.key_a());
  EXPECT_EQ(body_flag.status, 200) << body_flag.body;
  auto options_flag = h.post(
      "/ai/run/" + h.model(),
      json{{"options", {{"queueRequest", true}}}, {"requests", {reversal("q")}}}.dump(), h.key_a());
  EXPECT_EQ(options_flag.status, 200) << options_flag.body;

  auto list = h.get("/v1/async?limit=2", h.key_a());
  ASSERT_EQ(list.status, 200) << list.body;
  EXPECT_EQ(list.json()["result"]["data"].size(), 2u);
  EXPECT_EQ(list.json()["result"]["has_more"], true);
  auto page2 = h.get(
      "/v1/async?limit=2&after=" + list.json()["result"]["last_id"].get<std::string>(), h.key_a());
  ASSERT_EQ(page2.json()["result"]["data"].size(), 1u);
  EXPECT_EQ(page2.json()["result"]["data"][0]["request_id"], id);
  EXPECT_EQ(page2.json()["result"]["has_more"], false);
  EXPECT_EQ(h.get("/v1/async?status=cancelled", h.key_a()).json()["result"]["data"].size(), 0u);

  auto c1 = h.post("/v1/async/" + id + "/cancel", "", h.key_a());
  ASSERT_EQ(c1.status, 200) << c1.body;
  EXPECT_EQ(c1.json()["result"]["status"], "cancelled");
  EXPECT_EQ(c1.json()["result"]["cancelled_now"], 3);
  EXPECT_EQ(c1.json()["result"]["already_cancelled"], false);
  auto c2 = h.post("/v1/async/" + id + "/cancel", "", h.key_a());
  ASSERT_EQ(c2.status, 200);
  EXPECT_EQ(c2.json()["result"]["already_cancelled"], true);
  EXPECT_EQ(c2.json()["result"]["cancelled_now"], 0);

  auto done = h.get("/v1/async/" + id, h.key_a()).json()["result"];
  EXPECT_EQ(done["status"], "cancelled");
  ASSERT_EQ(done["responses"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(done["responses"][i]["id"], i);
    EXPECT_EQ(done["responses"][i]["success"], false);
  }
  EXPECT_EQ(h.get("/v1/async?status=cancelled", h.key_a()).json()["result"]["data"].size(), 1u);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM outbox WHERE event_type = 'batch.cancelled'"), 1);
}

TEST(ApiTest, CompletedBatchAnswersInInputOrderWithUsage) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  std::string id = h.submit({reversal("ab"), reversal("cd"),
                             json{{"prompt", "reverse: ef"}, {"external_reference", "third"}}},
                            h.key_a());
  ASSERT_FALSE(id.empty());
  auto d = queue::Dispatcher::create(h.database_url(), h.redis_url(), {});
  ASSERT_TRUE(d.is_ok());
  ASSERT_TRUE((*d)->tick().is_ok());
  auto consumer = queue::LeaseClient::create(h.database_url(), h.redis_url(),
                                             {h.model(), "test-consumer", 30000, 3});
  ASSERT_TRUE(consumer.is_ok());
  auto leases = (*consumer)->pull(10, 1000);
  ASSERT_TRUE(leases.is_ok()) << leases.status().to_string();
  ASSERT_EQ(leases->size(), 3u);
  // Complete out of order: answers must still come back by input index.
  std::vector<queue::Completion> done;
  for (auto it = leases->rbegin(); it != leases->rend(); ++it) {
    json body = json::parse(it->body);
    done.push_back({*it, json{{"response", "r" + std::to_string(it->ref.idx)}}.dump(), 10, 3, 2});
  }
  // The first one alone, then the rest: partial results are visible in between.
  ASSERT_TRUE((*consumer)->complete({done[0]}).is_ok());
  auto mid = h.get("/v1/async/" + id + "?include=partial", h.key_a()).json()["result"];
  EXPECT_EQ(mid["status"], "running");
  EXPECT_EQ(mid["progress"]["completed"], 1);
  EXPECT_EQ(mid["responses"][2]["success"], true);
  auto rest = (*consumer)->complete({done[1], done[2]});
  ASSERT_TRUE(rest.is_ok());
  auto res = h.post("/ai/run/" + h.model(), json{{"request_id", id}}.dump(), h.key_a());
  json result = res.json()["result"];
  EXPECT_EQ(result["status"], "completed");
  ASSERT_EQ(result["responses"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(result["responses"][i]["id"], i);
    EXPECT_EQ(result["responses"][i]["success"], true);
    EXPECT_EQ(result["responses"][i]["result"]["response"], "r" + std::to_string(i));
  }
  EXPECT_EQ(result["responses"][2]["external_reference"], "third");
  EXPECT_EQ(result["usage"]["prompt_tokens"], 30);
  EXPECT_EQ(result["usage"]["completion_tokens"], 9);
  EXPECT_EQ(result["usage"]["total_tokens"], 39);
  EXPECT_EQ(result["usage"]["prompt_tokens_details"]["cached_tokens"], 6);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM outbox WHERE event_type = 'batch.completed'"), 1);
}

struct BadCase {
  std::string name;
  std::string target;  // "" → the harness model's queueRequest URL
  std::string body;
  std::string key;  // "a", "b", "none", "bad"
  int status;
  std::string field;
  int index = -1;
};

TEST(ApiTest, BadInputIsRejectedWholeAndWritesNothing) {
  ApiHarness h(/*max_batch_requests=*/5, /*body_limit_bytes=*/64 * 1024);
  ASSERT_TRUE(h.ok());
  std::string ok_req = reversal("a").dump();
  std::string big(100 * 1024, 'x');
  std::vector<BadCase> cases = {
      {"malformed json", "", "{\"requests\": [", "a", 400, "body"},
      {"body not object", "", "[1,2]", "a", 400, "body"},
      {"requests missing", "", "{\"queueRequest\":true}", "a", 400, "requests"},
      {"requests not array", "", "{\"requests\": {}}", "a", 400, "requests"},
      {"empty requests", "", "{\"requests\": []}", "a", 400, "requests"},
      {"too many requests", "",
       "{\"requests\": [" + ok_req + "," + ok_req + "," + ok_req + "," + ok_req + "," + ok_req +
           "," + ok_req + "]}",
       "a", 413, "requests"},
      {"too large body", "", "{\"requests\": [{\"prompt\": \"" + big + "\"}]}", "a", 413, "body"},
      {"unknown model", "/ai/run/@hr/nope?queueRequest=true", "{\"requests\": [" + ok_req + "]}",
       "a", 400, "model"},
      {"wrong type", "",
       "{\"requests\": [" + ok_req + ", {\"prompt\": \"x\", \"max_tokens\": \"ten\"}]}", "a", 400,
       "requests[1].max_tokens", 1},
      {"max_tokens over context", "",
       "{\"requests\": [{\"prompt\": \"x\", \"max_tokens\": 100000}]}", "a", 400,
       "requests[0].max_tokens", 0},
      {"bad role", "",
       "{\"requests\": [{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}]}", "a", 400,
       "requests[0].messages[0].role", 0},
      {"both prompt and messages", "",
       "{\"requests\": [{\"prompt\": \"x\", \"messages\": [{\"role\": \"user\", \"content\": "
       "\"x\"}]}]}",
       "a", 400, "requests[0].prompt", 0},
      {"unknown field", "", "{\"requests\": [{\"prompt\": \"x\", \"max_token\": 3}]}", "a", 400,
       "requests[0].max_token", 0},
      {"duplicate reference", "",
       "{\"requests\": [{\"prompt\": \"x\", \"external_reference\": \"r1\"}, {\"prompt\": \"y\", "
       "\"external_reference\": \"r1\"}]}",
       "a", 400, "requests[1].external_reference", 1},
      {"bad temperature", "", "{\"requests\": [{\"prompt\": \"x\", \"temperature\": -1}]}", "a",
       400, "requests[0].temperature", 0},
      {"bad completion window", "",
       "{\"requests\": [" + ok_req + "], \"completion_window\": \"soon\"}", "a", 400,
       "completion_window"},
      {"missing key", "", "{\"requests\": [" + ok_req + "]}", "none", 401, "Authorization"},
      {"invalid key", "", "{\"requests\": [" + ok_req + "]}", "bad", 401, "Authorization"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::string key = c.key == "a" ? h.key_a() : c.key == "bad" ? "hr_not_a_real_key_000000" : "";
    std::string target =
        c.target.empty() ? "/ai/run/" + h.model() + "?queueRequest=true" : c.target;
    auto r = h.post(target, c.body, key);
    EXPECT_EQ(r.status, c.status) << r.body;
    json j = r.json();
    ASSERT_FALSE(j.is_discarded()) << r.body;
    EXPECT_EQ(j["success"], false);
    ASSERT_EQ(j["errors"].size(), 1u);
    EXPECT_EQ(j["errors"][0]["field"], c.field) << r.body;
    EXPECT_FALSE(j["errors"][0]["message"].get<std::string>().empty());
    if (c.index >= 0) {
      EXPECT_EQ(j["errors"][0]["index"], c.index) << r.body;
    }
    EXPECT_EQ(h.scalar("SELECT count(*) FROM batches"), 0);
    EXPECT_EQ(h.scalar("SELECT count(*) FROM requests"), 0);
    EXPECT_EQ(h.scalar("SELECT count(*) FROM outbox"), 0);
  }
}

// Hostile bodies get 400 naming the field and leave the server up: JSON nested 200,000 deep (its
// copy would overflow the stack), NUL in a string (Postgres cannot store it), flags and option
// groups of the wrong type, n other than 1; and a path with bytes that are not UTF-8 gets its 400,
// not a 500.
TEST(ApiTest, HostileBodiesAreRefusedNamingTheField) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const json chat = {{"model", h.model()}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  struct Case {
    std::string target, body, field;
  };
  auto with = [&](const char* key, const json& value) {
    json b = chat;
    b[key] = value;
    return b.dump();
  };
  const std::string run = "/ai/run/" + h.model();
  const std::vector<Case> cases = {
      {"/v1/chat/completions", R"({"model":"x","stream":true,"x":)" + deep + "}", "body"},
      {"/v1/chat/completions", R"({"model":"x","x":)" + deep + "}", "body"},
      {run + "?queueRequest=true", R"({"requests":[{"prompt":"x"}],"metadata":)" + deep + "}",
       "body"},
      {run + "?queueRequest=true", R"({"requests":[{"prompt":"x"}],"metadata":{"k":"\u0000"}})",
       "body"},
      {run + "?queueRequest=true",
       R"({"requests":[{"prompt":"x"}],"metadata":{"k":")" + std::string(16380, 'm') + "\"}}",
       "metadata"},
      {"/v1/chat/completions", with("stream", "yes"), "stream"},
      {"/v1/chat/completions", with("options", {{"rejectIfBusy", "yes"}}), "options.rejectIfBusy"},
      {"/v1/chat/completions", with("options", 3), "options"},
      {"/v1/chat/completions", with("n", 3), "n"},
      {"/v1/chat/completions?api-version=1", with("n", 2), "n"},
      {run, R"({"prompt":"x","options":{"rejectIfBusy":1}})", "options.rejectIfBusy"},
  };
  for (const Case& c : cases) {
    auto r = h.post(c.target, c.body, h.key_a());
    EXPECT_EQ(r.status, 400) << c.target << " " << r.body.substr(0, 300);
    json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.body.substr(0, 300);
    const json& field = j.contains("error") ? j["error"]["param"] : j["errors"][0]["field"];
    EXPECT_EQ(field, c.field) << c.target << " " << r.body.substr(0, 300);
  }
  json stream_usage = json::parse(with("stream", true));
  stream_usage["stream_options"] = {{"include_usage", 1}};
  auto su = h.post("/v1/chat/completions", stream_usage.dump(), h.key_a());
  EXPECT_EQ(su.status, 400) << su.body;
  EXPECT_EQ(su.json()["error"]["param"], "stream_options.include_usage");
  auto bad_path = h.post("/ai/run/%FF%FE", R"({"prompt":"x"})", h.key_a());
  EXPECT_EQ(bad_path.status, 400) << bad_path.body;
  EXPECT_EQ(bad_path.json()["errors"][0]["field"], "model");
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches"), 0);
  EXPECT_EQ(h.get("/v1/models", h.key_a()).status, 200);  // still serving
}

// Without a valid key the API answers 401 from the header alone: it never reads (or waits for) the
// body, however large its Content-Length (within the limits), on upload routes too. Keyed requests
// are unaffected.
TEST(ApiTest, RequestsWithoutAValidKeyAreRefusedBeforeTheirBodyIsRead) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  struct Case {
    std::string target;
    std::string auth;   // the Authorization header line, or none
    std::string field;  // where the error names the field
  };
  const std::string run = "/ai/run/" + h.model() + "?queueRequest=true";
  for (const Case& c : std::vector<Case>{
           {run, "", "/errors/0/field"},
           {run, "Authorization: Bearer hr_not_a_key\r\n", "/errors/0/field"},
           {"/v1/files", "", "/error/param"},
           {"/v1/chat/completions", "Authorization: Basic eDp5\r\n", "/error/param"}}) {
    SCOPED_TRACE(c.target + " " + c.auth);
    testing::RawConnection conn(h.port());
    conn.send("POST " + c.target + " HTTP/1.1\r\nHost: x\r\n" + c.auth +
              "Content-Length: 9000000\r\n\r\n");
    std::string answer = conn.receive();  // the server closes without waiting for the body
    ASSERT_EQ(answer.rfind("HTTP/1.1 401", 0), 0u) << answer;
    json body = json::parse(answer.substr(answer.find("\r\n\r\n") + 4), nullptr, false);
    EXPECT_EQ(body.value(json::json_pointer(c.field), json()), "Authorization") << answer;
  }
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches"), 0);
  // With a key, the body is read and the batch queued.
  EXPECT_FALSE(h.submit(json::array({reversal("a")}), h.key_a()).empty());
}

// The Authorization scheme is case-insensitive: BEARER and bEaReR keys work; a scheme without a
// key or another scheme does not.
TEST(ApiTest, TheBearerSchemeIsCaseInsensitive) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  for (const std::string& scheme :
       std::vector<std::string>{"Bearer ", "bearer ", "BEARER ", "bEaReR  "}) {
    testing::RawConnection conn(h.port());
    conn.send("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: " + scheme + h.key_a() +
              "\r\nConnection: close\r\n\r\n");
    const std::string answer = conn.receive();
    EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << scheme << ": " << answer;
  }
  for (const std::string& header :
       std::vector<std::string>{"BEARER ", "Bearer", "Basic " + h.key_a()}) {
    testing::RawConnection conn(h.port());
    conn.send("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: " + header +
              "\r\nConnection: close\r\n\r\n");
    const std::string answer = conn.receive();
    EXPECT_EQ(answer.rfind("HTTP/1.1 401", 0), 0u) << header << ": " << answer;
  }
}

TEST(ApiTest, IdsAreScopedToTheirAccount) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  std::string id = h.submit(json::array({reversal("a")}), h.key_a());
  ASSERT_FALSE(id.empty());
  std::string unknown = "01a20000-0000-7000-8000-000000000000";
  for (const std::string& target : {id, unknown}) {
    SCOPED_TRACE(target);
    auto g = h.get("/v1/async/" + target, h.key_b());
    EXPECT_EQ(g.status, 404);
    auto p = h.post("/ai/run/" + h.model(), json{{"request_id", target}}.dump(), h.key_b());
    EXPECT_EQ(p.status, 404);
    auto c = h.post("/v1/async/" + target + "/cancel", "", h.key_b());
    EXPECT_EQ(c.status, 404);
    // Same answer for someone else's id and an unknown one, apart from the id itself.
    EXPECT_EQ(g.json()["errors"][0]["code"], 1004);
  }
  EXPECT_EQ(h.get("/v1/async", h.key_b()).json()["result"]["data"].size(), 0u);
  EXPECT_EQ(h.get("/v1/async/" + id, h.key_a()).status, 200);
  auto bad = h.get("/v1/async/not-a-uuid", h.key_a());
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.json()["errors"][0]["field"], "request_id");
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE status = 'queued'"), 1);
}

TEST(ApiTest, IdempotencyKeyReplaysOrConflicts) {
  ApiHarness h([](api::ApiConfig& c) { c.models.push_back("@test/other-model:128"); });
  ASSERT_TRUE(h.ok());
  std::string target = "/ai/run/" + h.model() + "?queueRequest=true";
  std::string body = json{{"requests", {reversal("a"), reversal("b")}}}.dump();
  auto r1 = h.post(target, body, h.key_a(), {{"Idempotency-Key", "k-1"}});
  auto r2 = h.post(target, body, h.key_a(), {{"Idempotency-Key", "k-1"}});
  ASSERT_EQ(r1.status, 200) << r1.body;
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(r1.json()["result"]["request_id"], r2.json()["result"]["request_id"]);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches"), 1);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests"), 2);
  auto r3 = h.post(target, json{{"requests", {reversal("z")}}}.dump(), h.key_a(),
                   {{"Idempotency-Key", "k-1"}});
  EXPECT_EQ(r3.status, 409) << r3.body;
  EXPECT_EQ(r3.json()["errors"][0]["field"], "Idempotency-Key");
  // The same body for another model (named in the path) is another request.
  auto r5 = h.post("/ai/run/@test/other-model?queueRequest=true", body, h.key_a(),
                   {{"Idempotency-Key", "k-1"}});
  EXPECT_EQ(r5.status, 409) << r5.body;
  EXPECT_EQ(r5.json()["errors"][0]["field"], "Idempotency-Key");
  // Another account may use the same key independently.
  auto r4 = h.post(target, body, h.key_b(), {{"Idempotency-Key", "k-1"}});
  EXPECT_EQ(r4.status, 200);
  EXPECT_NE(r4.json()["result"]["request_id"], r1.json()["result"]["request_id"]);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches"), 2);
}

TEST(ApiTest, HundredThousandRequestBatchRoundTrips) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  json reqs = json::array();
  for (int i = 0; i < 100000; ++i) {
    reqs.push_back({{"prompt", "reverse: " + std::to_string(i)},
                    {"external_reference", "r" + std::to_string(i)}});
  }
  std::string id = h.submit(reqs, h.key_a());
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests"), 100000);
  EXPECT_EQ(h.scalar("SELECT num_total FROM batches"), 100000);
  auto p = h.get("/v1/async/" + id + "?include=partial", h.key_a());
  ASSERT_EQ(p.status, 200);
  json responses = p.json()["result"]["responses"];
  ASSERT_EQ(responses.size(), 100000u);
  for (int i = 0; i < 100000; i += 9973) {
    EXPECT_EQ(responses[i]["id"], i);
    EXPECT_EQ(responses[i]["external_reference"], "r" + std::to_string(i));
  }
}

// A revoked key stops working at once in every API process on the database, though each had it
// cached: by key (the account's other keys go on), then by account; the revocation is counted
// once, and revoking again revokes nothing.
TEST(ApiTest, RevokedKeysAreRefusedAtOnceByEveryApiProcess) {
  ApiHarness h1;
  ASSERT_TRUE(h1.ok());
  ApiHarness h2(h1.database_url(), h1.redis_url());  // a second API process, its own keys
  ASSERT_TRUE(h2.ok());
  const std::string list = "/v1/async?limit=1";
  for (ApiHarness* h : {&h1, &h2}) {
    for (const std::string& k : {h1.key_a(), h2.key_a(), h1.key_b()})
      ASSERT_EQ(h->get(list, k).status, 200) << k;  // cached by both now
  }
  // Polls both processes until both refuse `key` (at most 2 s).
  auto refused_everywhere = [&](const std::string& key) {
    for (int i = 0; i < 40; ++i) {
      if (h1.get(list, key).status == 401 && h2.get(list, key).status == 401) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  pqxx::connection conn(h1.database_url());
  ASSERT_EQ(queue::revoke_api_keys(conn, h1.key_a(), "").value(), 1);
  EXPECT_TRUE(refused_everywhere(h1.key_a()));
  EXPECT_EQ(h1.get(list, h2.key_a()).status, 200) << "the account's other key";
  EXPECT_EQ(queue::revoke_api_keys(conn, h1.key_a(), "").value(), 0);
  EXPECT_EQ(queue::revoke_api_keys(conn, "hr_no_such_key_0123456789", "").status().code(),
            StatusCode::kNotFound);
  ASSERT_EQ(queue::revoke_api_keys(conn, "", "alice").value(), 1);
  EXPECT_TRUE(refused_everywhere(h2.key_a()));
  EXPECT_EQ(h2.get(list, h1.key_b()).status, 200) << "another account";
}

// Keys the server has not seen are looked up at a bounded rate: a flood of made-up keys gets 401
// for the burst, then 429 with Retry-After, while a cached key keeps its 200; a bad key sent again
// is not looked up again; a key created meanwhile works at once (creation clears the caches).
TEST(ApiTest, UnknownKeysAreLookedUpAtABoundedRate) {
  ApiHarness h([](ApiConfig& c) {
    c.key_lookups_per_s = 10;               // a burst of 20
    c.key_lookups_per_client_per_s = 1000;  // the shared limit, not the client's, is tested here
  });
  ASSERT_TRUE(h.ok());
  const std::string list = "/v1/async?limit=1";
  ASSERT_EQ(h.get(list, h.key_a()).status, 200);  // cached from here
  const auto metric = [&](const std::string& name) {
    const std::string page = h.get("/metrics", "").body;
    const size_t at = page.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(page.substr(at + name.size() + 2));
  };
  const double lookups0 = metric("headroom_auth_lookups_total");
  int unauthorized = 0, limited = 0;
  bool retry_after = false;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) {
    auto r = testing::http_call("GET", h.port(), list, "",
                                {{"Authorization", "Bearer hr_made_up_" + std::to_string(i)}});
    unauthorized += r.status == 401;
    if (r.status == 429) {
      ++limited;
      retry_after = retry_after || r.headers.count("Retry-After") > 0;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(unauthorized, 19);  // the burst, less key_a's own lookup
  EXPECT_LE(unauthorized, 20 + static_cast<int>(10 * secs) + 2) << secs << " s";
  EXPECT_EQ(unauthorized + limited, 100);
  EXPECT_TRUE(retry_after);
  EXPECT_EQ(h.get(list, h.key_a()).status, 200) << "a cached key is not held back";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // 5 lookups' worth
  const double lookups1 = metric("headroom_auth_lookups_total");
  EXPECT_EQ(
      testing::http_call("GET", h.port(), list, "", {{"Authorization", "Bearer hr_made_up_0"}})
          .status,
      401);
  EXPECT_EQ(metric("headroom_auth_lookups_total"), lookups1) << "a known bad key, looked up again";
  EXPECT_GE(lookups1 - lookups0, 19.0);
  // A key created now (looked up once already as unknown) works at once.
  const std::string fresh = "hr_fresh_key_0123456789abcdef";
  EXPECT_EQ(h.get(list, fresh).status, 401);
  pqxx::connection conn(h.database_url());
  ASSERT_TRUE(queue::ensure_api_key(conn, "alice", fresh).is_ok());
  int status = 0;
  for (int i = 0; i < 20 && status != 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    status = h.get(list, fresh).status;
  }
  EXPECT_EQ(status, 200);
}

// The status of a GET sent from `source` (a loopback address other than 127.0.0.1 is another
// client to the server).
int status_from(const std::string& source, int port, const std::string& target,
                const std::string& key) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &remote.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof remote) != 0) {
    ::close(fd);
    return 0;
  }
  const std::string req = "GET " + target + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key +
                          "\r\nConnection: close\r\n\r\n";
  (void)::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  char buf[64] = {};
  const ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
  ::close(fd);
  return n > 12 ? std::atoi(buf + 9) : 0;
}

// A client that sends bad keys is limited on its own: past its burst its unknown keys get 429
// naming the address without a lookup, while its cached key still works and another client's
// unknown keys are still looked up (one guesser cannot spend the lookups everybody shares).
TEST(ApiTest, BadKeysAreLimitedPerClient) {
  ApiHarness h([](ApiConfig& c) {
    c.key_lookups_per_s = 100000;
    c.key_lookups_per_client_per_s = 5;  // a burst of 10
  });
  ASSERT_TRUE(h.ok());
  const std::string list = "/v1/async?limit=1";
  ASSERT_EQ(h.get(list, h.key_a()).status, 200);  // cached from here
  int unauthorized = 0, limited = 0;
  std::string message;
  for (int i = 0; i < 40; ++i) {
    auto r = testing::http_call("GET", h.port(), list, "",
                                {{"Authorization", "Bearer hr_guess_" + std::to_string(i)}});
    unauthorized += r.status == 401;
    if (r.status == 429) {
      ++limited;
      message = r.body;
    }
  }
  EXPECT_GE(unauthorized, 10);
  EXPECT_LE(unauthorized, 14);
  EXPECT_EQ(unauthorized + limited, 40);
  EXPECT_NE(message.find("too many invalid API keys from this address"), std::string::npos)
      << message;
  EXPECT_EQ(h.get(list, h.key_a()).status, 200) << "a cached key is not held back";
  EXPECT_EQ(status_from("127.0.0.2", h.port(), list, "hr_another_guess"), 401)
      << "another client's unknown key is looked up";
  EXPECT_EQ(status_from("127.0.0.2", h.port(), list, h.key_b()), 200);
}

}  // namespace
}  // namespace hr::api
