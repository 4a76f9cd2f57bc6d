// The OpenAI Batch API over real HTTP, Postgres and Redis: files (upload, list, get, content,
// delete, tenancy, limits), batch creation and its validation (a bad file fails the batch and
// enqueues nothing), the live results, finalizing into output and error files, cancel while
// running, and the completion window. A test consumer stands in for the workers.
#include <gtest/gtest.h>

#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <thread>

#include "base/clock.h"
#include "queue/dispatcher.h"
#include "queue/files.h"
#include "queue/lease.h"
#include "queue/open_work.h"
#include "queue/openai_batches.h"
#include "queue/redis.h"
#include "queue/stream.h"
#include "queue/webhooks.h"
#include "tests/testing/api_harness.h"
#include "tests/testing/test_consumer.h"
#include "tests/testing/webhook_receiver.h"
#include "webhooks/deliverer.h"

namespace hr::api {
namespace {

using nlohmann::json;
using testing::ApiHarness;
using testing::HttpResult;

constexpr const char* kBoundary = "----hr-test-boundary-7d3f";

std::string form(const std::string& content, const std::string& purpose = "batch",
                 const std::string& filename = "input.jsonl", bool with_file = true,
                 bool with_purpose = true) {
  std::string b = kBoundary;
  std::string body;
  if (with_purpose) {
    body += "--" + b + "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n" + purpose +
            "\r\n";
  }
  if (with_file) {
    body += "--" + b + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"" + filename +
            "\"\r\nContent-Type: application/octet-stream\r\n\r\n" + content + "\r\n";
  }
  return body + "--" + b + "--\r\n";
}

HttpResult upload(ApiHarness& h, const std::string& key, const std::string& body) {
  return h.post("/v1/files", body, key,
                {{"Content-Type", std::string("multipart/form-data; boundary=") + kBoundary}});
}

json request_line(const std::string& custom_id, const std::string& model, const std::string& text) {
  return {{"custom_id", custom_id},
          {"method", "POST"},
          {"url", "/v1/chat/completions"},
          {"body",
           {{"model", model},
            {"messages", {{{"role", "user"}, {"content", "reverse: " + text}}}},
            {"max_tokens", 40}}}};
}

std::string jsonl(const std::vector<json>& lines) {
  std::string out;
  for (const json& l : lines) out += l.dump() + "\n";
  return out;
}

std::string reversal_file(ApiHarness& h, int n) {
  std::vector<json> lines;
  for (int i = 0; i < n; ++i)
    lines.push_back(request_line("req-" + std::to_string(i), h.model(), "w" + std::to_string(i)));
  if (n > 2) lines[2]["body"]["logprobs"] = true;  // one asks for log probabilities
  return jsonl(lines);
}

// Uploads `content` for account a and returns the file id.
std::string upload_ok(ApiHarness& h, const std::string& content) {
  HttpResult r = upload(h, h.key_a(), form(content));
  EXPECT_EQ(r.status, 200) << r.body;
  return r.json().value("id", "");
}

HttpResult create(ApiHarness& h, const std::string& key, const std::string& file_id,
                  const std::string& window = "24h", json extra = json::object()) {
  json body = {{"input_file_id", file_id},
               {"endpoint", "/v1/chat/completions"},
               {"completion_window", window}};
  body.update(extra);
  return h.post("/v1/batches", body.dump(), key);
}

json get_batch(ApiHarness& h, const std::string& id) {
  return h.get("/v1/batches/" + id, h.key_a()).json();
}

std::vector<json> lines_of(const std::string& body) {
  std::vector<json> out;
  size_t p = 0;
  while (p < body.size()) {
    size_t nl = body.find('\n', p);
    if (nl == std::string::npos) nl = body.size();
    if (nl > p) out.push_back(json::parse(body.substr(p, nl - p)));
    p = nl + 1;
  }
  return out;
}

std::vector<json> file_lines(ApiHarness& h, const json& file_id) {
  if (!file_id.is_string()) return {};
  HttpResult r = h.get("/v1/files/" + file_id.get<std::string>() + "/content", h.key_a());
  EXPECT_EQ(r.status, 200) << r.body;
  return lines_of(r.body);
}

void expect_openai_error(const HttpResult& r, int status, const std::string& param) {
  EXPECT_EQ(r.status, status) << r.body;
  json j = r.json();
  ASSERT_TRUE(j.contains("error")) << r.body;
  EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  EXPECT_TRUE(j["error"]["type"].is_string());
  if (param.empty()) {
    EXPECT_TRUE(j["error"]["param"].is_null()) << r.body;
  } else {
    EXPECT_EQ(j["error"]["param"], param) << r.body;
  }
}

using testing::Consumer;

TEST(OpenAiBatchTest, FilesRoundTripAndTenancy) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  std::string content = reversal_file(h, 3);
  HttpResult up = upload(h, h.key_a(), form(content, "batch", "my input.jsonl"));
  ASSERT_EQ(up.status, 200) << up.body;
  json f = up.json();
  std::string id = f["id"];
  EXPECT_EQ(f["object"], "file");
  EXPECT_EQ(f["bytes"], content.size());
  EXPECT_EQ(f["filename"], "my input.jsonl");
  EXPECT_EQ(f["purpose"], "batch");
  EXPECT_EQ(f["status"], "processed");
  EXPECT_GT(f["created_at"].get<int64_t>(), 1700000000);

  EXPECT_EQ(h.get("/v1/files/" + id, h.key_a()).json(), f);
  HttpResult got = h.get("/v1/files/" + id + "/content", h.key_a());
  ASSERT_EQ(got.status, 200);
  EXPECT_EQ(got.body, content);
  json list = h.get("/v1/files", h.key_a()).json();
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], id);
  EXPECT_EQ(list["has_more"], false);

  // Another account sees nothing of it.
  expect_openai_error(h.get("/v1/files/" + id, h.key_b()), 404, "");
  EXPECT_EQ(h.get("/v1/files/" + id + "/content", h.key_b()).status, 404);
  EXPECT_EQ(testing::http_call("DELETE", h.port(), "/v1/files/" + id, "",
                               {{"Authorization", "Bearer " + h.key_b()}})
                .status,
            404);
  EXPECT_EQ(h.get("/v1/files", h.key_b()).json()["data"].size(), 0u);
  EXPECT_EQ(h.get("/v1/files/not-an-id", h.key_a()).status, 404);

  // A file larger than one stored chunk streams back with its Content-Length, byte for byte.
  std::string big;
  for (int i = 0; big.size() < 9 * 1024 * 1024; ++i) {
    big +=
        request_line("big-" + std::to_string(i), h.model(), std::string(200, 'a' + i % 26)).dump() +
        "\n";
  }
  HttpResult up_big = upload(h, h.key_a(), form(big));
  ASSERT_EQ(up_big.status, 200) << up_big.body;
  std::string big_id = up_big.json()["id"];
  EXPECT_EQ(h.scalar("SELECT count(*) FROM file_chunks WHERE file_id = '" + big_id + "'"), 3);
  HttpResult got_big = h.get("/v1/files/" + big_id + "/content", h.key_a());
  ASSERT_EQ(got_big.status, 200);
  EXPECT_EQ(got_big.headers["Content-Length"], std::to_string(big.size()));
  EXPECT_TRUE(got_big.body == big) << "content differs";

  // Pagination, newest first (and oldest first with order=asc).
  json page = h.get("/v1/files?limit=1", h.key_a()).json();
  ASSERT_EQ(page["data"].size(), 1u);
  EXPECT_EQ(page["data"][0]["id"], big_id);
  EXPECT_EQ(page["has_more"], true);
  json page2 = h.get("/v1/files?limit=1&after=" + big_id, h.key_a()).json();
  EXPECT_EQ(page2["data"][0]["id"], id);
  EXPECT_EQ(page2["has_more"], false);
  EXPECT_EQ(h.get("/v1/files?order=asc", h.key_a()).json()["data"][0]["id"], id);
  EXPECT_EQ(h.get("/v1/files?purpose=batch_output", h.key_a()).json()["data"].size(), 0u);
  expect_openai_error(h.get("/v1/files?limit=0", h.key_a()), 400, "limit");
  expect_openai_error(h.get("/v1/files?order=up", h.key_a()), 400, "order");

  // Delete: the row is marked, the bytes are gone, the id is 404 from then on.
  HttpResult del = testing::http_call("DELETE", h.port(), "/v1/files/" + id, "",
                                      {{"Authorization", "Bearer " + h.key_a()}});
  ASSERT_EQ(del.status, 200) << del.body;
  EXPECT_EQ(del.json(), (json{{"id", id}, {"object", "file"}, {"deleted", true}}));
  EXPECT_EQ(h.get("/v1/files/" + id, h.key_a()).status, 404);
  EXPECT_EQ(h.get("/v1/files/" + id + "/content", h.key_a()).status, 404);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM file_chunks WHERE file_id = '" + id + "'"), 0);
  EXPECT_EQ(testing::http_call("DELETE", h.port(), "/v1/files/" + id, "",
                               {{"Authorization", "Bearer " + h.key_a()}})
                .status,
            404);
}

TEST(OpenAiBatchTest, BadUploadsAreRejectedAndStoreNothing) {
  ApiHarness h([](ApiConfig& c) {
    c.max_file_bytes = 2000;
    c.max_file_lines = 3;
  });
  ASSERT_TRUE(h.ok());
  std::string one = request_line("a", h.model(), "x").dump() + "\n";
  expect_openai_error(h.post("/v1/files", form(one), h.key_a()), 400, "Content-Type");
  expect_openai_error(upload(h, h.key_a(), "no parts at all"), 400, "body");
  expect_openai_error(upload(h, h.key_a(), form(one, "batch", "f", true, false)), 400, "purpose");
  expect_openai_error(upload(h, h.key_a(), form(one, "fine-tune")), 400, "purpose");
  expect_openai_error(upload(h, h.key_a(), form(one, "batch", "f", false, true)), 400, "file");
  expect_openai_error(upload(h, h.key_a(), form("")), 400, "file");
  expect_openai_error(upload(h, h.key_a(), form("\n \r\n")), 400, "file");
  expect_openai_error(upload(h, h.key_a(), form(std::string(2001, 'x'))), 413, "file");
  expect_openai_error(upload(h, h.key_a(), form(one + one + one + one)), 413, "file");
  HttpResult no_key =
      h.post("/v1/files", form(one), "",
             {{"Content-Type", std::string("multipart/form-data; boundary=") + kBoundary}});
  expect_openai_error(no_key, 401, "Authorization");
  EXPECT_EQ(no_key.json()["error"]["type"], "authentication_error");
  // Up to the limits is fine.
  EXPECT_EQ(upload(h, h.key_a(), form(one + one + one)).status, 200);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM files"), 1);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM file_chunks"), 1);
}

TEST(OpenAiBatchTest, BadInputFilesFailTheBatchAndEnqueueNothing) {
  ApiHarness h([](ApiConfig& c) { c.max_batch_requests = 4; });
  ASSERT_TRUE(h.ok());
  const std::string m = h.model();
  json good = request_line("ok", m, "abc");
  json bad_role = request_line("r", m, "x");
  bad_role["body"]["messages"][0]["role"] = "robot";
  json wrong_url = request_line("u", m, "x");
  wrong_url["url"] = "/v1/completions";
  struct Case {
    std::string name;
    std::string content;
    std::string code;
    json line;  // 1-based, or null
    std::string param;
  };
  std::vector<Case> cases = {
      {"invalid json", good.dump() + "\n{\"custom_id\": \n", "invalid_json_line", 2, ""},
      {"duplicate custom_id", jsonl({good, request_line("b", m, "x"), good}), "duplicate_custom_id",
       3, "custom_id"},
      {"wrong url", jsonl({good, wrong_url}), "invalid_url", 2, "url"},
      {"unknown model", jsonl({request_line("a", "@hr/nope", "x")}), "model_not_found", 1,
       "body.model"},
      {"bad body", jsonl({good, bad_role}), "invalid_request", 2, "body.messages[0].role"},
      {"too many requests",
       jsonl({request_line("1", m, "x"), request_line("2", m, "x"), request_line("3", m, "x"),
              request_line("4", m, "x"), request_line("5", m, "x")}),
       "too_many_requests", nullptr, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string file_id = upload_ok(h, c.content);
    HttpResult r = create(h, h.key_a(), file_id, "24h", {{"metadata", {{"case", c.name}}}});
    ASSERT_EQ(r.status, 200) << r.body;
    json b = r.json();
    EXPECT_EQ(b["status"], "failed");
    EXPECT_EQ(b["input_file_id"], file_id);
    EXPECT_EQ(b["request_counts"], (json{{"total", 0}, {"completed", 0}, {"failed", 0}}));
    EXPECT_TRUE(b["failed_at"].is_number());
    EXPECT_TRUE(b["output_file_id"].is_null());
    EXPECT_EQ(b["metadata"]["case"], c.name);
    ASSERT_EQ(b["errors"]["object"], "list");
    ASSERT_GE(b["errors"]["data"].size(), 1u);
    json e = b["errors"]["data"][0];
    EXPECT_EQ(e["code"], c.code) << e;
    EXPECT_EQ(e["line"], c.line) << e;
    if (c.param.empty()) {
      EXPECT_TRUE(e["param"].is_null()) << e;
    } else {
      EXPECT_EQ(e["param"], c.param) << e;
    }
    // Stored so that GET and the list show it.
    EXPECT_EQ(get_batch(h, b["id"]), b);
  }
  // Several bad lines: each is reported with its own line number.
  std::string many = jsonl({good, wrong_url, request_line("ok", m, "dup")}) + "oops\n";
  json b = create(h, h.key_a(), upload_ok(h, many)).json();
  ASSERT_EQ(b["errors"]["data"].size(), 3u) << b;
  EXPECT_EQ(b["errors"]["data"][0]["line"], 2);
  EXPECT_EQ(b["errors"]["data"][1]["code"], "duplicate_custom_id");
  EXPECT_EQ(b["errors"]["data"][1]["line"], 3);
  EXPECT_EQ(b["errors"]["data"][2]["code"], "invalid_json_line");
  EXPECT_EQ(b["errors"]["data"][2]["line"], 4);

  // Nothing was enqueued anywhere: no request rows, nothing for the relay, nothing in Redis.
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests"), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches WHERE num_total > 0"), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches WHERE status <> 'failed'"), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM outbox WHERE event_type = 'batch.failed'"),
            static_cast<int64_t>(cases.size()) + 1);
  auto redis = queue::RedisClient::connect(h.redis_url());
  ASSERT_TRUE(redis.is_ok());
  auto len = (*redis)->command({"XLEN", queue::stream_key(m)});
  ASSERT_TRUE(len.is_ok());
  EXPECT_EQ(len->integer, 0);
  EXPECT_EQ(h.get("/v1/batches?limit=100", h.key_a()).json()["data"].size(), cases.size() + 1);

  // Request-level mistakes are errors (400/404 naming the field), and store nothing.
  std::string file_id = upload_ok(h, jsonl({good}));
  int64_t before = h.scalar("SELECT count(*) FROM batches");
  expect_openai_error(h.post("/v1/batches", "{", h.key_a()), 400, "body");
  expect_openai_error(
      h.post("/v1/batches",
             json{{"endpoint", "/v1/chat/completions"}, {"completion_window", "24h"}}.dump(),
             h.key_a()),
      400, "input_file_id");
  expect_openai_error(create(h, h.key_a(), file_id, "soon"), 400, "completion_window");
  expect_openai_error(create(h, h.key_a(), file_id, "24h", {{"endpoint", "/v1/embeddings"}}), 400,
                      "endpoint");
  expect_openai_error(create(h, h.key_a(), file_id, "24h", {{"metadata", "x"}}), 400, "metadata");
  expect_openai_error(create(h, h.key_a(), file_id, "24h", {{"urgency", 1}}), 400, "urgency");
  expect_openai_error(create(h, h.key_a(), file_id, "24h", {{"priority", 101}}), 400, "priority");
  expect_openai_error(create(h, h.key_a(), file_id, "24h", {{"metadata", {{"priority", "high"}}}}),
                      400, "metadata.priority");
  expect_openai_error(create(h, h.key_b(), file_id), 404, "input_file_id");
  expect_openai_error(create(h, h.key_a(), "0190a000-0000-7000-8000-000000000000"), 404,
                      "input_file_id");
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches"), before);
}

TEST(OpenAiBatchTest, FinishedBatchWritesOutputAndErrorFiles) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  Consumer consumer(h);
  std::string file_id = upload_ok(h, reversal_file(h, 5));
  HttpResult r = create(h, h.key_a(), file_id, "24h", {{"metadata", {{"job", "nightly"}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  json b = r.json();
  std::string id = b["id"];
  EXPECT_EQ(b["object"], "batch");
  EXPECT_EQ(b["status"], "in_progress");
  EXPECT_EQ(b["endpoint"], "/v1/chat/completions");
  EXPECT_EQ(b["completion_window"], "24h");
  EXPECT_EQ(b["model"], h.model());
  EXPECT_NEAR(b["expires_at"].get<double>() - b["created_at"].get<double>(), 86400, 2);
  EXPECT_EQ(b["request_counts"]["total"], 5);
  EXPECT_TRUE(b["errors"].is_null());
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests"), 5);

  auto leases = consumer.pull(10);
  ASSERT_EQ(leases.size(), 5u);
  // Results so far, while the batch runs.
  consumer.complete({leases[3], leases[1]});
  HttpResult partial = h.get("/v1/batches/" + id + "/output", h.key_a());
  ASSERT_EQ(partial.status, 200) << partial.body;
  EXPECT_EQ(partial.headers["x-batch-status"], "in_progress");
  auto so_far = lines_of(partial.body);
  ASSERT_EQ(so_far.size(), 2u);
  EXPECT_EQ(so_far[0]["custom_id"], "req-1");
  EXPECT_EQ(so_far[1]["custom_id"], "req-3");
  EXPECT_EQ(h.get("/v1/batches/" + id + "/errors", h.key_a()).body, "");
  json running = get_batch(h, id);
  EXPECT_EQ(running["request_counts"], (json{{"total", 5}, {"completed", 2}, {"failed", 0}}));

  // One request fails; the rest complete. The batch has ended but its files are not written yet.
  auto failed = consumer.lease->fail({{leases[0], "engine_error", "the engine stopped", false}});
  ASSERT_TRUE(failed.is_ok());
  consumer.complete({leases[2], leases[4]});
  json finalizing = get_batch(h, id);
  EXPECT_EQ(finalizing["status"], "finalizing");
  EXPECT_TRUE(finalizing["finalizing_at"].is_number());
  EXPECT_TRUE(finalizing["output_file_id"].is_null());
  EXPECT_EQ(consumer.finalize(), 1);
  EXPECT_EQ(consumer.finalize(), 0);  // once only
  json done = get_batch(h, id);
  EXPECT_EQ(done["status"], "completed");
  EXPECT_TRUE(done["completed_at"].is_number());
  EXPECT_EQ(done["request_counts"], (json{{"total", 5}, {"completed", 4}, {"failed", 1}}));
  EXPECT_EQ(done["metadata"]["job"], "nightly");
  EXPECT_EQ(done["usage"]["input_tokens"], 28);
  EXPECT_EQ(done["usage"]["output_tokens"], 12);

  auto output = file_lines(h, done["output_file_id"]);
  ASSERT_EQ(output.size(), 4u);
  std::vector<int> expect = {1, 2, 3, 4};
  for (size_t i = 0; i < output.size(); ++i) {
    int k = expect[i];
    const json& l = output[i];
    EXPECT_EQ(l["custom_id"], "req-" + std::to_string(k));
    EXPECT_TRUE(l["error"].is_null());
    EXPECT_EQ(l["response"]["status_code"], 200);
    const json& body = l["response"]["body"];
    EXPECT_EQ(body["object"], "chat.completion");
    EXPECT_EQ(body["model"], h.model());
    std::string w = "w" + std::to_string(k);
    EXPECT_EQ(body["choices"][0]["message"]["content"], std::string(w.rbegin(), w.rend()));
    EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(body["usage"]["total_tokens"], 10);
    EXPECT_EQ(body["choices"][0]["logprobs"], k == 2 ? Consumer::kStoredLogprobs : json(nullptr));
  }
  auto errors = file_lines(h, done["error_file_id"]);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0]["custom_id"], "req-0");
  EXPECT_TRUE(errors[0]["response"].is_null());
  EXPECT_EQ(errors[0]["error"]["code"], "engine_error");
  // The files are ordinary files of the account, and the live view matches them byte for byte.
  json out_file = h.get("/v1/files/" + done["output_file_id"].get<std::string>(), h.key_a()).json();
  EXPECT_EQ(out_file["purpose"], "batch_output");
  EXPECT_EQ(
      h.get("/v1/batches/" + id + "/output", h.key_a()).body,
      h.get("/v1/files/" + done["output_file_id"].get<std::string>() + "/content", h.key_a()).body);
  EXPECT_EQ(h.get("/v1/files/" + done["output_file_id"].get<std::string>(), h.key_b()).status, 404);
  EXPECT_EQ(h.get("/v1/files?purpose=batch_output", h.key_a()).json()["data"].size(), 2u);

  // Listing and tenancy; a Workers-AI batch is not an OpenAI batch.
  json list = h.get("/v1/batches", h.key_a()).json();
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], id);
  EXPECT_EQ(list["first_id"], id);
  expect_openai_error(h.get("/v1/batches/" + id, h.key_b()), 404, "");
  expect_openai_error(h.post("/v1/batches/" + id + "/cancel", "", h.key_b()), 404, "");
  EXPECT_EQ(h.get("/v1/batches/" + id + "/output", h.key_b()).status, 404);
  EXPECT_EQ(h.get("/v1/batches", h.key_b()).json()["data"].size(), 0u);
  std::string cf = h.submit({{{"prompt", "reverse: x"}}}, h.key_a());
  EXPECT_EQ(h.get("/v1/batches/" + cf, h.key_a()).status, 404);
  EXPECT_EQ(h.get("/v1/batches", h.key_a()).json()["data"].size(), 1u);
  // The same batch is visible in the Workers-AI shape too.
  EXPECT_EQ(h.get("/v1/async/" + id, h.key_a()).json()["result"]["status"],
            "completed_with_errors");
}

TEST(OpenAiBatchTest, ListBatchesPages) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  std::string file_id = upload_ok(h, reversal_file(h, 1));
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(create(h, h.key_a(), file_id).json()["id"]);
  json page = h.get("/v1/batches?limit=2", h.key_a()).json();
  ASSERT_EQ(page["data"].size(), 2u);
  EXPECT_EQ(page["object"], "list");
  EXPECT_EQ(page["first_id"], ids[2]);
  EXPECT_EQ(page["data"][0]["id"], ids[2]);
  EXPECT_EQ(page["has_more"], true);
  json page2 =
      h.get("/v1/batches?limit=2&after=" + page["last_id"].get<std::string>(), h.key_a()).json();
  ASSERT_EQ(page2["data"].size(), 1u);
  EXPECT_EQ(page2["data"][0]["id"], ids[0]);
  EXPECT_EQ(page2["has_more"], false);
  // An Idempotency-Key makes a retried create answer the same batch, enqueued once.
  json body = {{"input_file_id", file_id},
               {"endpoint", "/v1/chat/completions"},
               {"completion_window", "24h"}};
  HttpResult first = h.post("/v1/batches", body.dump(), h.key_a(), {{"Idempotency-Key", "k1"}});
  HttpResult again = h.post("/v1/batches", body.dump(), h.key_a(), {{"Idempotency-Key", "k1"}});
  ASSERT_EQ(first.status, 200) << first.body;
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(first.json()["id"], again.json()["id"]);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests"), 4);
  body["completion_window"] = "1h";
  expect_openai_error(h.post("/v1/batches", body.dump(), h.key_a(), {{"Idempotency-Key", "k1"}}),
                      409, "Idempotency-Key");
  expect_openai_error(h.get("/v1/batches?limit=101", h.key_a()), 400, "limit");
  expect_openai_error(h.get("/v1/batches?after=x", h.key_a()), 400, "after");
}

TEST(OpenAiBatchTest, CancelWhileRunningKeepsFinishedResults) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  Consumer consumer(h);
  std::string id = create(h, h.key_a(), upload_ok(h, reversal_file(h, 6))).json()["id"];
  auto leases = consumer.pull(2);
  ASSERT_EQ(leases.size(), 2u);
  consumer.complete({leases[0]});
  HttpResult c1 = h.post("/v1/batches/" + id + "/cancel", "", h.key_a());
  ASSERT_EQ(c1.status, 200) << c1.body;
  EXPECT_EQ(c1.json()["status"], "cancelling");
  EXPECT_TRUE(c1.json()["cancelling_at"].is_number());
  HttpResult c2 = h.post("/v1/batches/" + id + "/cancel", "", h.key_a());
  ASSERT_EQ(c2.status, 200) << c2.body;
  EXPECT_EQ(c2.json()["status"], "cancelling");
  EXPECT_EQ(c2.json()["cancelling_at"], c1.json()["cancelling_at"]);
  // Nothing more is handed out; the running request finishes and keeps its result.
  EXPECT_TRUE(consumer.lease->pull(10, 100)->empty());
  consumer.complete({leases[1]});
  EXPECT_EQ(get_batch(h, id)["status"], "cancelling");  // ended, files not yet written
  EXPECT_EQ(consumer.finalize(), 1);
  json done = get_batch(h, id);
  EXPECT_EQ(done["status"], "cancelled");
  EXPECT_TRUE(done["cancelled_at"].is_number());
  EXPECT_TRUE(done["completed_at"].is_null());
  EXPECT_EQ(done["request_counts"], (json{{"total", 6}, {"completed", 2}, {"failed", 4}}));
  auto output = file_lines(h, done["output_file_id"]);
  ASSERT_EQ(output.size(), 2u);
  EXPECT_EQ(output[0]["custom_id"], "req-0");
  EXPECT_EQ(output[1]["custom_id"], "req-1");
  auto errors = file_lines(h, done["error_file_id"]);
  ASSERT_EQ(errors.size(), 4u);
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_EQ(errors[i]["custom_id"], "req-" + std::to_string(i + 2));
    EXPECT_EQ(errors[i]["error"]["code"], "batch_cancelled");
  }
  HttpResult c3 = h.post("/v1/batches/" + id + "/cancel", "", h.key_a());
  EXPECT_EQ(c3.status, 200);
  EXPECT_EQ(c3.json()["status"], "cancelled");
  EXPECT_EQ(h.scalar("SELECT count(*) FROM outbox WHERE event_type = 'batch.cancelled'"), 1);

  // Cancelling a batch with nothing running ends it at once.
  std::string idle = create(h, h.key_a(), upload_ok(h, reversal_file(h, 3))).json()["id"];
  EXPECT_EQ(h.post("/v1/batches/" + idle + "/cancel", "", h.key_a()).json()["status"],
            "cancelling");
  EXPECT_EQ(consumer.finalize(), 1);
  json idle_done = get_batch(h, idle);
  EXPECT_EQ(idle_done["status"], "cancelled");
  EXPECT_TRUE(idle_done["output_file_id"].is_null());
  EXPECT_EQ(file_lines(h, idle_done["error_file_id"]).size(), 3u);
}

// Finished batches that cannot be finalized yet (here: locked by another dispatcher finalizing
// them) do not keep later ones waiting, however many of them come first.
// A batch whose output spans several pages of requests and more than one file chunk: the files
// are written a piece at a time, and read back whole, in input order, every chunk but the last
// exactly kFileChunkBytes.
TEST(OpenAiBatchTest, LargeOutputsAreWrittenAPieceAtATime) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  Consumer consumer(h);
  const int n = 1100;  // past one page of finalize's reads (1,000)
  std::vector<json> lines;
  for (int i = 0; i < n; ++i) {
    lines.push_back(request_line("req-" + std::to_string(i), h.model(), "w" + std::to_string(i)));
  }
  std::string id = create(h, h.key_a(), upload_ok(h, jsonl(lines))).json()["id"];
  std::vector<queue::Lease> leases;
  for (int i = 0; i < 50 && static_cast<int>(leases.size()) < n; ++i) {
    for (auto& l : consumer.pull(n)) leases.push_back(std::move(l));
  }
  ASSERT_EQ(static_cast<int>(leases.size()), n);
  std::vector<queue::Lease> good;
  std::vector<queue::Lease> bad;
  for (auto& l : leases) (l.ref.idx == 5 || l.ref.idx == 1050 ? bad : good).push_back(l);
  consumer.complete(good);
  consumer.fail(bad);
  // Each answer 4,100 bytes long: 1,098 of them are ~4.6 MB of output, two chunks.
  h.scalar(
      "WITH u AS (UPDATE requests SET result = jsonb_set(result::jsonb, '{response}', "
      "to_jsonb(lpad(idx::text, 4100, 'x')))::text WHERE status = 'completed' RETURNING 1) "
      "SELECT count(*) FROM u");
  EXPECT_EQ(consumer.finalize(), 1);
  json done = get_batch(h, id);
  ASSERT_TRUE(done["output_file_id"].is_string()) << done;
  const std::string out_id = done["output_file_id"];
  HttpResult content = h.get("/v1/files/" + out_id + "/content", h.key_a());
  ASSERT_EQ(content.status, 200);
  std::vector<json> output = lines_of(content.body);
  ASSERT_EQ(output.size(), static_cast<size_t>(n - 2));
  int k = 0;
  for (const json& l : output) {
    if (k == 5 || k == 1050) ++k;
    ASSERT_EQ(l["custom_id"], "req-" + std::to_string(k));
    const std::string text = l["response"]["body"]["choices"][0]["message"]["content"];
    EXPECT_EQ(text.size(), 4100u);
    EXPECT_TRUE(text.ends_with(std::to_string(k)));
    ++k;
  }
  EXPECT_GT(content.body.size(), static_cast<size_t>(queue::kFileChunkBytes));
  json file = h.get("/v1/files/" + out_id, h.key_a()).json();
  EXPECT_EQ(file["bytes"], content.body.size());
  EXPECT_EQ(h.scalar("SELECT num_lines FROM files WHERE id = '" + out_id + "'"), n - 2);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM file_chunks WHERE file_id = '" + out_id + "'"), 2);
  EXPECT_EQ(
      h.scalar("SELECT length(data) FROM file_chunks WHERE file_id = '" + out_id + "' AND seq = 0"),
      queue::kFileChunkBytes);
  auto errors = file_lines(h, done["error_file_id"]);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0]["custom_id"], "req-5");
  EXPECT_EQ(errors[1]["custom_id"], "req-1050");
}

TEST(OpenAiBatchTest, BatchesThatCannotBeFinalizedYetDoNotHoldUpTheRest) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  for (int i = 0; i < 3; ++i) {
    std::string id = create(h, h.key_a(), upload_ok(h, reversal_file(h, 1))).json()["id"];
    ASSERT_EQ(h.post("/v1/batches/" + id + "/cancel", "", h.key_a()).status, 200);
  }
  const std::string unfinalized =
      "SELECT count(*) FROM batches WHERE api_shape = 'openai' AND finished_at IS NOT NULL "
      "AND finalized_at IS NULL";
  ASSERT_EQ(h.scalar(unfinalized), 3);
  pqxx::connection locker(h.database_url());
  pqxx::work hold(locker);
  hold.exec("SELECT id FROM batches WHERE api_shape = 'openai' ORDER BY id LIMIT 2 FOR UPDATE");
  pqxx::connection conn(h.database_url());
  std::string cursor;
  int finalized = 0;
  for (int i = 0; i < 2; ++i) {  // two sweeps of two: the locked pair, then the third
    auto n = queue::finalize_openai_batches(conn, 2, &cursor);
    ASSERT_TRUE(n.is_ok()) << n.status().to_string();
    finalized += *n;
  }
  EXPECT_EQ(finalized, 1);
  EXPECT_EQ(h.scalar(unfinalized), 2);
  hold.abort();
  for (int i = 0; i < 2; ++i) {
    auto n = queue::finalize_openai_batches(conn, 2, &cursor);
    ASSERT_TRUE(n.is_ok()) << n.status().to_string();
    finalized += *n;
  }
  EXPECT_EQ(finalized, 3);
  EXPECT_EQ(h.scalar(unfinalized), 0);
}

TEST(OpenAiBatchTest, CompletionWindowExpiresUnfinishedRequests) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  Consumer consumer(h);
  HttpResult r = create(h, h.key_a(), upload_ok(h, reversal_file(h, 4)), "1s");
  ASSERT_EQ(r.status, 200) << r.body;
  std::string id = r.json()["id"];
  EXPECT_EQ(r.json()["completion_window"], "1s");
  auto leases = consumer.pull(2);
  ASSERT_EQ(leases.size(), 2u);
  consumer.complete({leases[0]});
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  auto expired = consumer.dispatcher->expire_deadlines();
  ASSERT_TRUE(expired.is_ok());
  EXPECT_EQ(*expired, 2);
  EXPECT_EQ(get_batch(h, id)["status"], "in_progress");  // one request still runs
  consumer.complete({leases[1]});  // finished after the deadline, but finished: kept
  EXPECT_EQ(get_batch(h, id)["status"], "finalizing");
  EXPECT_EQ(consumer.finalize(), 1);
  json done = get_batch(h, id);
  EXPECT_EQ(done["status"], "expired");
  EXPECT_TRUE(done["expired_at"].is_number());
  EXPECT_EQ(done["request_counts"], (json{{"total", 4}, {"completed", 2}, {"failed", 2}}));
  auto output = file_lines(h, done["output_file_id"]);
  ASSERT_EQ(output.size(), 2u);
  auto errors = file_lines(h, done["error_file_id"]);
  ASSERT_EQ(errors.size(), 2u);
  for (const json& e : errors) {
    EXPECT_EQ(e["error"]["code"], "batch_expired");
    EXPECT_TRUE(e["response"].is_null());
  }
  EXPECT_EQ(errors[0]["custom_id"], "req-2");
}

TEST(OpenAiBatchTest, OpenAiRoutesAnswerErrorsInOpenAiShape) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  json chat = {{"model", h.model()}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  expect_openai_error(h.post("/v1/chat/completions", chat.dump(), ""), 401, "Authorization");
  expect_openai_error(h.get("/v1/models", "hr_not_a_real_key_000000"), 401, "Authorization");
  json unknown = chat;
  unknown["model"] = "@hr/nope";
  expect_openai_error(h.post("/v1/chat/completions", unknown.dump(), h.key_a()), 400, "model");
  // No worker here: out of capacity, as OpenAI's 429.
  HttpResult busy = h.post("/v1/chat/completions", chat.dump(), h.key_a());
  expect_openai_error(busy, 429, "");
  EXPECT_EQ(busy.json()["error"]["type"], "rate_limit_error");
  json streamed = chat;
  streamed["stream"] = true;
  expect_openai_error(h.post("/v1/chat/completions", streamed.dump(), h.key_a()), 429, "");
  // The Workers-AI routes keep the project's shape.
  HttpResult cf = h.get("/v1/async/nope", h.key_a());
  EXPECT_EQ(cf.json()["success"], false);
  EXPECT_EQ(cf.json()["errors"][0]["field"], "request_id");
}

}  // namespace
}  // namespace hr::api

namespace hr::api {
namespace {

TEST(OpenAiBatchTest, WebhooksFromExtraFieldsOrMetadata) {
  testing::Receiver rx([](int) { return testing::Receiver::Answer{}; });
  ApiHarness h([](ApiConfig& c) { c.webhook_allow = {"loopback"}; });
  ASSERT_TRUE(h.ok() && rx.ok());
  std::string file = upload_ok(h, reversal_file(h, 2));
  HttpResult extra =
      create(h, h.key_a(), file, "24h",
             {{"webhook_url", rx.url("/extra")}, {"webhook_events", {"batch.completed"}}});
  ASSERT_EQ(extra.status, 200) << extra.body;
  HttpResult meta = create(
      h, h.key_a(), file, "24h",
      {{"metadata",
        {{"webhook_url", rx.url("/meta")}, {"webhook_events", "batch.completed, batch.failed"}}}});
  ASSERT_EQ(meta.status, 200) << meta.body;
  // A file that fails validation fails the batch: its webhook hears batch.failed.
  std::string bad = upload_ok(h, "{not json}\n");
  HttpResult failed = create(h, h.key_a(), bad, "24h", {{"webhook_url", rx.url("/failed")}});
  ASSERT_EQ(failed.status, 200) << failed.body;
  EXPECT_EQ(failed.json()["status"], "failed");
  // Bad webhook fields are refused before anything is written.
  expect_openai_error(create(h, h.key_a(), file, "24h", {{"webhook_url", "http://10.0.0.1/x"}}),
                      400, "webhook_url");
  expect_openai_error(create(h, h.key_a(), file, "24h",
                             {{"metadata", {{"webhook_url", "http://169.254.169.254/"}}}}),
                      400, "metadata.webhook_url");
  expect_openai_error(
      create(h, h.key_a(), file, "24h",
             {{"metadata",
               {{"webhook_url", rx.url()}, {"webhook_secret", queue::new_webhook_secret()}}}}),
      400, "metadata.webhook_secret");
  expect_openai_error(create(h, h.key_a(), file, "24h",
                             {{"webhook_url", rx.url()}, {"webhook_events", {"batch.done"}}}),
                      400, "webhook_events");
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches"), 3);

  Consumer c(h);
  c.complete(c.pull(10));
  webhooks::DeliveryOptions o;
  o.allow = {"loopback"};
  auto d = webhooks::Deliverer::create(h.database_url(), o);
  ASSERT_TRUE(d.is_ok());
  for (int i = 0; i < 50 && rx.received().size() < 3; ++i) {
    ASSERT_TRUE((*d)->run_once().is_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto got = rx.received();
  ASSERT_EQ(got.size(), 3u);
  std::map<std::string, json> events;
  for (const auto& r : got) events[json::parse(r.body)["data"]["id"]] = json::parse(r.body);
  EXPECT_EQ(events[extra.json()["id"]]["type"], "batch.completed");
  EXPECT_EQ(events[meta.json()["id"]]["type"], "batch.completed");
  EXPECT_EQ(events[failed.json()["id"]]["type"], "batch.failed");
}

// An extra form field before the others.
std::string with_field(const std::string& name, const std::string& value, const std::string& rest) {
  return std::string("--") + kBoundary + "\r\nContent-Disposition: form-data; name=\"" + name +
         "\"\r\n\r\n" + value + "\r\n" + rest;
}

TEST(OpenAiBatchTest, RetentionDeletionAndRetry) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  Consumer c(h);
  std::string content = reversal_file(h, 3);
  // expires_after on upload, as the SDKs send it in a form.
  HttpResult up = upload(h, h.key_a(),
                         with_field("expires_after[anchor]", "created_at",
                                    with_field("expires_after[seconds]", "3600", form(content))));
  ASSERT_EQ(up.status, 200) << up.body;
  EXPECT_EQ(up.json()["expires_at"], up.json()["created_at"].get<int64_t>() + 3600);
  expect_openai_error(
      upload(h, h.key_a(), with_field("expires_after[anchor]", "last_active_at", form(content))),
      400, "expires_after.anchor");
  expect_openai_error(upload(h, h.key_a(),
                             with_field("expires_after[anchor]", "created_at",
                                        with_field("expires_after[seconds]", "10", form(content)))),
                      400, "expires_after.seconds");
  json plain = upload(h, h.key_a(), form(content)).json();
  EXPECT_EQ(plain["expires_at"], plain["created_at"].get<int64_t>() + 30 * 86400);

  expect_openai_error(create(h, h.key_a(), plain["id"], "24h",
                             {{"output_expires_after", {{"anchor", "created_at"}}}}),
                      400, "output_expires_after.seconds");
  HttpResult created =
      create(h, h.key_a(), plain["id"], "24h",
             {{"output_expires_after", {{"anchor", "created_at"}, {"seconds", 7200}}}});
  ASSERT_EQ(created.status, 200) << created.body;
  json b = created.json();
  std::string id = b["id"];
  EXPECT_EQ(b["data_expires_at"], b["created_at"].get<int64_t>() + 7200);
  EXPECT_EQ(b["expires_at"], b["created_at"].get<int64_t>() + 86400) << "OpenAI's: the window";
  HttpResult refused = h.del("/v1/batches/" + id, h.key_a());
  expect_openai_error(refused, 409, "status");
  EXPECT_NE(refused.body.find("in_progress"), std::string::npos) << refused.body;

  std::vector<queue::Lease> leases = c.pull(3);
  ASSERT_EQ(leases.size(), 3u);
  std::sort(leases.begin(), leases.end(),
            [](const queue::Lease& a, const queue::Lease& b) { return a.ref.idx < b.ref.idx; });
  c.complete({leases[0], leases[2]});
  c.fail({leases[1]});
  ASSERT_EQ(c.finalize(), 1);
  b = get_batch(h, id);
  ASSERT_EQ(b["status"], "completed");
  for (const char* f : {"output_file_id", "error_file_id"}) {
    json file = h.get("/v1/files/" + b[f].get<std::string>(), h.key_a()).json();
    EXPECT_EQ(file["expires_at"], b["data_expires_at"]) << "output files go with their batch";
  }

  HttpResult retried = h.post("/v1/batches/" + id + "/retry", "", h.key_a());
  ASSERT_EQ(retried.status, 200) << retried.body;
  json r = retried.json();
  EXPECT_EQ(r["retried_from"], id);
  EXPECT_EQ(r["request_counts"]["total"], 1);
  EXPECT_EQ(r["status"], "in_progress");
  EXPECT_EQ(get_batch(h, id)["retries"], json::array({r["id"]}));
  std::vector<queue::Lease> again = c.pull(5);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(json::parse(again[0].body)["messages"][0]["content"], "reverse: w1");

  HttpResult deleted = h.del("/v1/batches/" + id, h.key_a());
  ASSERT_EQ(deleted.status, 200) << deleted.body;
  EXPECT_EQ(deleted.json(), json({{"id", id}, {"object", "batch.deleted"}, {"deleted", true}}));
  expect_openai_error(h.get("/v1/batches/" + id, h.key_a()), 404, "");
  expect_openai_error(h.get("/v1/files/" + b["output_file_id"].get<std::string>(), h.key_a()), 404,
                      "");
  ASSERT_TRUE(c.dispatcher->retain().is_ok());
  EXPECT_EQ(h.scalar("SELECT count(*) FROM files WHERE id IN ('" +
                     b["output_file_id"].get<std::string>() + "', '" +
                     b["error_file_id"].get<std::string>() + "')"),
            0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE batch_id = '" + id + "'"), 0);
  EXPECT_EQ(get_batch(h, r["id"])["retried_from"], id) << "the retry lives on";

  // An expired file is gone to reads at once, and from the store at the next purge.
  std::string fid = up.json()["id"];
  h.scalar("WITH u AS (UPDATE files SET expires_at = now() - interval '1 second' WHERE id = '" +
           fid + "' RETURNING 1) SELECT count(*) FROM u");
  expect_openai_error(h.get("/v1/files/" + fid, h.key_a()), 404, "");
  ASSERT_TRUE(c.dispatcher->retain().is_ok());
  EXPECT_EQ(h.scalar("SELECT count(*) FROM file_chunks WHERE file_id = '" + fid + "'"), 0);
}

// A batch's priority: an extra field or metadata's string; shown on the batch object; the
// account's default when neither says.
TEST(OpenAiBatchTest, PriorityFromAnExtraFieldOrMetadata) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  std::string file_id = upload_ok(h, reversal_file(h, 2));
  HttpResult r = create(h, h.key_a(), file_id, "24h", {{"priority", 7}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["priority"], 7);
  EXPECT_EQ(get_batch(h, r.json()["id"])["priority"], 7);
  r = create(h, h.key_a(), file_id, "24h", {{"metadata", {{"priority", "-3"}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(get_batch(h, r.json()["id"])["priority"], -3);
  h.scalar(
      "WITH u AS (UPDATE accounts SET default_priority = 4 WHERE name = 'alice' "
      "RETURNING 1) SELECT count(*) FROM u");
  r = create(h, h.key_a(), file_id);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(get_batch(h, r.json()["id"])["priority"], 4);
}

// While a batch is open its object carries the forecast (extensions): when it should finish at
// the model's throughput (as the dispatcher publishes it), and a warning when its window looks
// out of reach.
TEST(OpenAiBatchTest, AnOpenBatchShowsItsEstimatedCompletion) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  auto redis = queue::RedisClient::connect(h.redis_url());
  ASSERT_TRUE(redis.is_ok());
  ASSERT_TRUE(queue::publish_model_rate(**redis, h.model(), 0.01).is_ok());
  HttpResult r = create(h, h.key_a(), upload_ok(h, reversal_file(h, 3)), "24h");
  ASSERT_EQ(r.status, 200) << r.body;
  const int64_t now = SystemClock::instance().now_unix_ms() / 1000;
  ASSERT_TRUE(r.json().contains("estimated_completion_at")) << r.body;
  EXPECT_NEAR(r.json()["estimated_completion_at"].get<int64_t>(), now + 300, 2) << r.body;
  EXPECT_FALSE(r.json().contains("warnings")) << r.body;
  ASSERT_TRUE(queue::publish_model_rate(**redis, h.model(), 0.00001).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the view is read again
  json b = get_batch(h, r.json()["id"]);
  EXPECT_EQ(b["warnings"][0]["code"], "deadline_at_risk") << b.dump();
}

}  // namespace
}  // namespace hr::api
