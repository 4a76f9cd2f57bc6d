// OpenAI batch input files, line by line (pure): splitting, each documented error with its code,
// param and 1-based line, the model rule, and OpenAI's errors object; the status mapping and the
// batch object's fields; the output and error line renderer.
#include "api/batch_file.h"

#include <gtest/gtest.h>

#include "api/openai_objects.h"
#include "queue/openai_batches.h"

namespace hr::api {
namespace {

using nlohmann::json;

std::string line(const std::string& id, const std::string& model = "@hr/m",
                 const std::string& content = "reverse: abc") {
  return json{
      {"custom_id", id},
      {"method", "POST"},
      {"url", "/v1/chat/completions"},
      {"body", {{"model", model}, {"messages", {{{"role", "user"}, {"content", content}}}}}}}
      .dump();
}

TEST(BatchFileTest, SplitsNonBlankLinesWithLineNumbers) {
  std::string content = "a\r\n\n  \t\nb\nc";
  auto lines = split_jsonl(content);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].line, 1);
  EXPECT_EQ(lines[0].text, "a");
  EXPECT_EQ(lines[1].line, 4);
  EXPECT_EQ(lines[1].text, "b");
  EXPECT_EQ(lines[2].line, 5);
  EXPECT_EQ(count_jsonl_lines(content), 3);
  EXPECT_EQ(count_jsonl_lines(""), 0);
  EXPECT_EQ(count_jsonl_lines("\n\r\n \n"), 0);
  EXPECT_EQ(count_jsonl_lines("x\n"), 1);
}

TEST(BatchFileTest, ValidLinesBecomeNormalizedRequests) {
  std::vector<ModelSpec> models = {{"@hr/other", 64}, {"@hr/m", 128}};
  InputValidator v(models, BatchLimits{}, "/v1/chat/completions");
  json first = json::parse(line("a"));
  first["body"]["n"] = 1;
  first["body"]["user"] = "someone";
  std::string content = first.dump() + "\n" + line("b") + "\n";
  auto lines = split_jsonl(content);
  const ModelSpec* model = v.pick_model(lines);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->name, "@hr/m");
  queue::NewRequest out;
  EXPECT_FALSE(v.check(lines[0], &out).has_value());
  EXPECT_EQ(out.custom_id, "a");
  json body = json::parse(out.body);  // n = 1 and user are accepted and dropped
  EXPECT_EQ(body["messages"][0]["content"], "reverse: abc");
  EXPECT_FALSE(body.contains("model"));
  EXPECT_FALSE(body.contains("n"));
  EXPECT_FALSE(body.contains("user"));
  EXPECT_FALSE(v.check(lines[1], &out).has_value());
  EXPECT_EQ(out.custom_id, "b");
}

TEST(BatchFileTest, EachBadLineHasItsCodeParamAndLine) {
  std::vector<ModelSpec> models = {{"@hr/m", 128}, {"@hr/n", 128}};
  json ok = json::parse(line("x"));
  auto with = [&](const std::string& key, const json& value) {
    json j = ok;
    j[key] = value;
    return j.dump();
  };
  auto without = [&](const std::string& key) {
    json j = ok;
    j.erase(key);
    return j.dump();
  };
  json bad_role = ok;
  bad_role["body"]["messages"][0]["role"] = "robot";
  json too_long = ok;
  too_long["body"]["max_tokens"] = 100000;
  json two_answers = ok;
  two_answers["body"]["n"] = 2;
  json no_model = ok;
  no_model["body"].erase("model");
  struct Case {
    std::string text;
    std::string code;
    std::string param;
  };
  std::vector<Case> cases = {
      {"{not json", "invalid_json_line", ""},
      {"[1, 2]", "invalid_json_line", ""},
      {without("custom_id"), "missing_required_parameter", "custom_id"},
      {with("custom_id", 7), "invalid_custom_id", "custom_id"},
      {with("custom_id", ""), "invalid_custom_id", "custom_id"},
      {with("method", "GET"), "invalid_method", "method"},
      {without("method"), "missing_required_parameter", "method"},
      {with("url", "/v1/embeddings"), "invalid_url", "url"},
      {without("body"), "missing_required_parameter", "body"},
      {with("body", "text"), "invalid_request", "body"},
      {no_model.dump(), "missing_required_parameter", "body.model"},
      {line("x", "@hr/unknown"), "model_not_found", "body.model"},
      {line("x", "@hr/n"), "mismatched_model", "body.model"},
      {bad_role.dump(), "invalid_request", "body.messages[0].role"},
      {too_long.dump(), "invalid_request", "body.max_tokens"},
      {with("extra", 1), "invalid_request", "extra"},
      {two_answers.dump(), "invalid_request", "body.n"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    InputValidator v(models, BatchLimits{}, "/v1/chat/completions");
    std::string content = line("first") + "\n\n" + c.text + "\n";
    auto lines = split_jsonl(content);
    ASSERT_EQ(v.pick_model(lines)->name, "@hr/m");
    queue::NewRequest out;
    ASSERT_FALSE(v.check(lines[0], &out).has_value());
    std::optional<LineError> e = v.check(lines[1], &out);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code, c.code);
    EXPECT_EQ(e->param, c.param);
    EXPECT_EQ(e->line, 3);
    EXPECT_EQ(e->message.rfind("line 3: ", 0), 0u) << e->message;
  }
}

TEST(BatchFileTest, DuplicateCustomIdNamesTheFirstLine) {
  std::vector<ModelSpec> models = {{"@hr/m", 128}};
  InputValidator v(models, BatchLimits{}, "/v1/chat/completions");
  std::string content = line("a") + "\n" + line("b") + "\n" + line("a") + "\n";
  auto lines = split_jsonl(content);
  v.pick_model(lines);
  queue::NewRequest out;
  EXPECT_FALSE(v.check(lines[0], &out));
  EXPECT_FALSE(v.check(lines[1], &out));
  auto e = v.check(lines[2], &out);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "duplicate_custom_id");
  EXPECT_NE(e->message.find("already used on line 1"), std::string::npos) << e->message;
  json errors = errors_object({*e, {"empty_file", "no requests", "", std::nullopt}});
  EXPECT_EQ(errors["object"], "list");
  ASSERT_EQ(errors["data"].size(), 2u);
  EXPECT_EQ(errors["data"][0]["line"], 3);
  EXPECT_EQ(errors["data"][0]["param"], "custom_id");
  EXPECT_TRUE(errors["data"][1]["line"].is_null());
  EXPECT_TRUE(errors["data"][1]["param"].is_null());
}

TEST(BatchFileTest, NoServedModelMeansNoModel) {
  std::vector<ModelSpec> models = {{"@hr/m", 128}};
  InputValidator v(models, BatchLimits{}, "/v1/chat/completions");
  std::string content = line("a", "@x/y") + "\n{bad\n";
  EXPECT_EQ(v.pick_model(split_jsonl(content)), nullptr);
}

queue::OpenAiBatch batch(const std::string& status) {
  queue::OpenAiBatch b;
  b.info.id = "0190a000-0000-7000-8000-000000000001";
  b.info.status = status;
  b.info.model = "@hr/m";
  b.info.num_total = 10;
  b.info.num_completed = 6;
  b.info.num_failed = 1;
  b.info.num_cancelled = 2;
  b.info.num_expired = 1;
  b.info.created_at_ms = 1000000;
  b.info.deadline_ms = 2000000;
  b.completion_window = "24h";
  b.endpoint = "/v1/chat/completions";
  return b;
}

TEST(OpenAiObjectsTest, StatusMapping) {
  auto b = batch("queued");
  EXPECT_EQ(openai_batch_status(b), "in_progress");
  b.info.status = "running";
  EXPECT_EQ(openai_batch_status(b), "in_progress");
  b.info.cancel_requested = true;
  EXPECT_EQ(openai_batch_status(b), "cancelling");
  b.info.status = "cancelled";
  b.info.finished_at_ms = 1500000;
  EXPECT_EQ(openai_batch_status(b), "cancelling");  // files not written yet
  b.finalized_at_ms = 1500100;
  EXPECT_EQ(openai_batch_status(b), "cancelled");
  for (const char* internal : {"completed", "completed_with_errors", "failed"}) {
    auto d = batch(internal);
    d.info.finished_at_ms = 1500000;
    EXPECT_EQ(openai_batch_status(d), "finalizing") << internal;
    d.finalized_at_ms = 1500100;
    EXPECT_EQ(openai_batch_status(d), "completed") << internal;
  }
  auto e = batch("expired");
  e.info.finished_at_ms = 1500000;
  e.finalized_at_ms = 1500100;
  EXPECT_EQ(openai_batch_status(e), "expired");
  auto v = batch("failed");
  v.errors_json = R"({"object":"list","data":[]})";
  v.info.finished_at_ms = v.finalized_at_ms = 1000000;
  EXPECT_EQ(openai_batch_status(v), "failed");
}

TEST(OpenAiObjectsTest, BatchObjectFields) {
  auto b = batch("completed_with_errors");
  b.info.finished_at_ms = 1500000;
  b.finalized_at_ms = 1501000;
  b.metadata_json = R"({"k":"v"})";
  b.output_file_id = "out";
  json j = json::parse(batch_object(b).dump());
  std::vector<std::string> keys;
  nlohmann::ordered_json ordered = batch_object(b);
  for (const auto& [key, value] : ordered.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"id",
                                            "object",
                                            "endpoint",
                                            "model",
                                            "errors",
                                            "input_file_id",
                                            "completion_window",
                                            "status",
                                            "output_file_id",
                                            "error_file_id",
                                            "created_at",
                                            "in_progress_at",
                                            "expires_at",
                                            "finalizing_at",
                                            "completed_at",
                                            "failed_at",
                                            "expired_at",
                                            "cancelling_at",
                                            "cancelled_at",
                                            "request_counts",
                                            "usage",
                                            "metadata",
                                            "data_expires_at",
                                            "retried_from",
                                            "priority",
                                            "retries"}));  // OpenAI's order, then extensions
  EXPECT_EQ(j["object"], "batch");
  EXPECT_EQ(j["status"], "completed");
  EXPECT_EQ(j["created_at"], 1000);
  EXPECT_EQ(j["in_progress_at"], 1000);
  EXPECT_EQ(j["expires_at"], 2000);
  EXPECT_EQ(j["finalizing_at"], 1500);
  EXPECT_EQ(j["completed_at"], 1501);
  EXPECT_TRUE(j["failed_at"].is_null());
  EXPECT_TRUE(j["cancelled_at"].is_null());
  EXPECT_TRUE(j["errors"].is_null());
  EXPECT_TRUE(j["error_file_id"].is_null());
  EXPECT_EQ(j["output_file_id"], "out");
  EXPECT_EQ(j["completion_window"], "24h");
  EXPECT_EQ(j["metadata"]["k"], "v");
  EXPECT_EQ(j["request_counts"], (json{{"total", 10}, {"completed", 6}, {"failed", 4}}));
  auto f = batch("failed");
  // As jsonb gives it back: its own key order.
  f.errors_json = R"({"data":[{"line":null,"code":"empty_file","param":null,"message":"m"}],)"
                  R"("object":"list"})";
  f.info.num_total = f.info.num_completed = f.info.num_failed = 0;
  f.info.num_cancelled = f.info.num_expired = 0;
  f.info.finished_at_ms = f.finalized_at_ms = 1000000;
  json fj = json::parse(batch_object(f).dump());
  EXPECT_EQ(fj["status"], "failed");
  EXPECT_EQ(fj["failed_at"], 1000);
  EXPECT_TRUE(fj["in_progress_at"].is_null());
  EXPECT_TRUE(fj["finalizing_at"].is_null());
  EXPECT_EQ(fj["errors"]["data"][0]["code"], "empty_file");
  EXPECT_EQ(
      batch_object(f)["errors"].dump(),
      R"({"object":"list","data":[{"code":"empty_file","message":"m","param":null,"line":null}]})");
}

TEST(OpenAiObjectsTest, ResultLinesForEveryEnding) {
  std::string out, err;
  queue::ResultRow done{3,
                        "c3",
                        "completed",
                        R"({"response":"cba","usage":{"prompt_tokens":5,"completion_tokens":4,)"
                        R"("total_tokens":9},"finish_reason":"length"})",
                        std::nullopt,
                        1700000000};
  wire::append_result_line("B", "@hr/m", done, &out, &err);
  EXPECT_TRUE(err.empty());
  ASSERT_EQ(out.back(), '\n');
  json o = json::parse(out);
  EXPECT_EQ(o["id"], "batch_req_B-3");
  EXPECT_EQ(o["custom_id"], "c3");
  EXPECT_TRUE(o["error"].is_null());
  EXPECT_EQ(o["response"]["status_code"], 200);
  const json& body = o["response"]["body"];
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["id"], "chatcmpl-B-3");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_EQ(body["model"], "@hr/m");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "cba");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["total_tokens"], 9);
  // Rendering is deterministic.
  std::string again, unused;
  wire::append_result_line("B", "@hr/m", done, &again, &unused);
  EXPECT_EQ(again, out);

  out.clear();
  queue::ResultRow failed{
      4, "c4", "failed", std::nullopt, R"({"code":"engine_error","message":"boom"})", 0};
  queue::ResultRow cancelled{5, "c5", "cancelled", std::nullopt, std::nullopt, 0};
  queue::ResultRow expired{
      6, "c6", "expired", std::nullopt, R"({"code":"batch_expired","message":"late"})", 0};
  for (const auto& r : {failed, cancelled, expired})
    wire::append_result_line("B", "m", r, &out, &err);
  EXPECT_TRUE(out.empty());
  auto lines = split_jsonl(err);
  ASSERT_EQ(lines.size(), 3u);
  std::vector<std::string> codes = {"engine_error", "batch_cancelled", "batch_expired"};
  for (int i = 0; i < 3; ++i) {
    json e = json::parse(lines[i].text);
    EXPECT_TRUE(e["response"].is_null());
    EXPECT_EQ(e["error"]["code"], codes[i]);
    EXPECT_FALSE(e["error"]["message"].get<std::string>().empty());
  }
}

}  // namespace
}  // namespace hr::api
