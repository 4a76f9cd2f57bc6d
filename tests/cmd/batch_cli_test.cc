// `headroom batch` (the real binary) against a real API over HTTP, Postgres and Redis, with a test
// consumer standing in for the workers: submit in both shapes and watch to the end, status, list,
// results, cancel and retry, the exit codes scripts rely on, and one-line errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/ids.h"
#include "tests/testing/api_harness.h"
#include "tests/testing/test_consumer.h"

namespace hr::cmd {
namespace {

using nlohmann::json;
using testing::ApiHarness;
using testing::HttpResult;

struct CliRun {
  int code = -1;
  std::string out;
};

CliRun run(const ApiHarness& h, const std::string& args, const std::string& key) {
  const std::string command = "HEADROOM_URL=http://127.0.0.1:" + std::to_string(h.port()) +
                              " HEADROOM_API_KEY='" + key + "' " + HEADROOM_BINARY +
                              " --log-level error batch " + args + " 2>&1";
  CliRun r;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string write_file(const std::string& name, const std::vector<json>& lines) {
  const std::string path = "/tmp/hr-batch-" + random_hex(6) + "-" + name;
  std::ofstream out(path);
  for (const json& l : lines) out << l.dump() << "\n";
  return path;
}

json request(const std::string& text) {
  return {{"messages", {{{"role", "user"}, {"content", "reverse: " + text}}}}, {"max_tokens", 8}};
}

class BatchCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(h_.ok());
    consumer_ = std::make_unique<testing::Consumer>(h_);
    // The workers: answer each request, and fail those whose prompt says so; hold while paused.
    worker_ = std::thread([this] {
      while (!stop_) {
        if (!paused_) {
          std::vector<queue::Lease> good, bad;
          for (queue::Lease& l : consumer_->pull(100)) {
            (l.body.find("reverse: fail") != std::string::npos ? bad : good).push_back(l);
          }
          if (!good.empty()) consumer_->complete(good);
          if (!bad.empty()) consumer_->fail(bad);
          consumer_->finalize();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  void TearDown() override {
    stop_ = true;
    if (worker_.joinable()) worker_.join();
  }

  ApiHarness h_;
  std::unique_ptr<testing::Consumer> consumer_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> paused_{false};
  std::thread worker_;
};

TEST_F(BatchCliTest, SubmitAndWatchThenStatusListAndResults) {
  const std::string file =
      write_file("mixed.jsonl", {request("a"), request("bc"), request("fail-1"), request("d")});
  CliRun submitted = run(h_, "submit " + file + " --model " + h_.model() + " --wait", h_.key_a());
  // One failed request: completed with errors.
  EXPECT_EQ(submitted.code, 2) << submitted.out;
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  ASSERT_TRUE(parse_uuid(id).is_ok()) << submitted.out;
  // Not a terminal: plain lines, the last one the outcome.
  EXPECT_NE(submitted.out.find("4/4 done, 1 failed"), std::string::npos) << submitted.out;
  EXPECT_NE(submitted.out.find("completed_with_errors  3 completed, 1 failed of 4"),
            std::string::npos)
      << submitted.out;
  EXPECT_EQ(submitted.out.find('\r'), std::string::npos);

  CliRun status = run(h_, "status " + id, h_.key_a());
  EXPECT_EQ(status.code, 2) << status.out;
  EXPECT_EQ(json::parse(status.out)["progress"]["failed"], 1) << status.out;

  const std::string out = "/tmp/hr-batch-" + random_hex(6) + "-results.jsonl";
  CliRun results = run(h_, "results " + id + " -o " + out, h_.key_a());
  EXPECT_EQ(results.code, 2) << results.out;
  std::ifstream in(out);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(lines[i]["id"], i);  // input order
  EXPECT_EQ(lines[0]["result"]["response"], "a");
  EXPECT_EQ(lines[1]["result"]["response"], "cb");
  EXPECT_EQ(lines[2]["success"], false);

  CliRun list = run(h_, "list", h_.key_a());
  EXPECT_EQ(list.code, 0) << list.out;
  EXPECT_NE(list.out.find(id), std::string::npos) << list.out;
  // Another account sees none of it.
  EXPECT_EQ(run(h_, "list", h_.key_b()).out.find(id), std::string::npos);
  EXPECT_EQ(run(h_, "status " + id, h_.key_b()).code, 1);

  // All good: 0. The OpenAI shape (custom_id lines) is uploaded and made a batch.
  CliRun good = run(
      h_,
      "submit " + write_file("good.jsonl", {request("x")}) + " --model " + h_.model() + " --wait",
      h_.key_a());
  EXPECT_EQ(good.code, 0) << good.out;
  json line = {{"custom_id", "one"},
               {"method", "POST"},
               {"url", "/v1/chat/completions"},
               {"body", request("openai")}};
  line["body"]["model"] = h_.model();
  CliRun openai = run(h_, "submit " + write_file("openai.jsonl", {line}) + " --wait", h_.key_a());
  EXPECT_EQ(openai.code, 0) << openai.out;
  EXPECT_NE(openai.out.find("1 completed, 0 failed of 1"), std::string::npos) << openai.out;
}

// Results come a page at a time (1,000), in input order; --resume continues a cut-off file from
// its last whole line and ends with the same file.
TEST_F(BatchCliTest, ResultsArePagedAndResumable) {
  std::vector<json> lines;
  for (int i = 0; i < 2500; ++i) lines.push_back(request("r" + std::to_string(i)));
  CliRun submitted =
      run(h_, "submit " + write_file("big.jsonl", lines) + " --model " + h_.model() + " --wait",
          h_.key_a());
  ASSERT_EQ(submitted.code, 0) << submitted.out;
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  const std::string out = "/tmp/hr-batch-" + random_hex(6) + "-all.jsonl";
  ASSERT_EQ(run(h_, "results " + id + " -o " + out, h_.key_a()).code, 0);
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string whole = read(out);
  ASSERT_EQ(std::count(whole.begin(), whole.end(), '\n'), 2500);
  size_t at = 0;
  for (int i = 0; i < 2500; ++i) {
    const size_t nl = whole.find('\n', at);
    json line = json::parse(whole.substr(at, nl - at));
    ASSERT_EQ(line["id"], i);
    const std::string text = "r" + std::to_string(i);
    ASSERT_EQ(line["result"]["response"], std::string(text.rbegin(), text.rend()));
    at = nl + 1;
  }
  // Cut after 1,234 lines and half of the next; resume.
  size_t cut = 0;
  for (int i = 0; i < 1234; ++i) cut = whole.find('\n', cut) + 1;
  const std::string partial = "/tmp/hr-batch-" + random_hex(6) + "-part.jsonl";
  {
    std::ofstream f(partial);
    f << whole.substr(0, cut + 20);
  }
  CliRun resumed = run(h_, "results " + id + " -o " + partial + " --resume", h_.key_a());
  EXPECT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(read(partial), whole);
  // The pieces are the API's: from and limit, checked.
  HttpResult piece = h_.get("/v1/async/" + id + "?include=partial&from=2499&limit=5", h_.key_a());
  ASSERT_EQ(piece.status, 200) << piece.body;
  ASSERT_EQ(piece.json()["result"]["responses"].size(), 1u);
  EXPECT_EQ(piece.json()["result"]["responses"][0]["id"], 2499);
  HttpResult bad = h_.get("/v1/async/" + id + "?include=partial&from=-1", h_.key_a());
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(bad.json()["errors"][0]["field"], "from") << bad.body;
}

TEST_F(BatchCliTest, CancelRetryAndErrors) {
  paused_ = true;
  const std::string file = write_file("two.jsonl", {request("a"), request("b")});
  CliRun submitted = run(h_, "submit " + file + " --model " + h_.model(), h_.key_a());
  ASSERT_EQ(submitted.code, 0) << submitted.out;
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  EXPECT_EQ(run(h_, "status " + id, h_.key_a()).code, 0);  // still open
  EXPECT_EQ(run(h_, "cancel " + id, h_.key_a()).code, 0);
  CliRun cancelled = run(h_, "status " + id + " --wait", h_.key_a());
  EXPECT_EQ(cancelled.code, 3) << cancelled.out;  // cancelled
  paused_ = false;
  CliRun retried = run(h_, "retry " + id, h_.key_a());
  ASSERT_EQ(retried.code, 0) << retried.out;
  const std::string again = retried.out.substr(0, retried.out.find('\n'));
  EXPECT_NE(again, id);
  EXPECT_EQ(run(h_, "status " + again + " --wait", h_.key_a()).code, 0);

  // Errors: one line naming what to fix, exit 1.
  CliRun no_key = run(h_, "list", "");
  EXPECT_EQ(no_key.code, 1);
  EXPECT_NE(no_key.out.find("HEADROOM_API_KEY"), std::string::npos) << no_key.out;
  CliRun bad_key = run(h_, "list", "hr_not_a_key_at_all_0000");
  EXPECT_EQ(bad_key.code, 1) << bad_key.out;
  CliRun no_model = run(h_, "submit " + file, h_.key_a());
  EXPECT_EQ(no_model.code, 1);
  EXPECT_NE(no_model.out.find("--model"), std::string::npos) << no_model.out;
  CliRun missing = run(h_, "submit /tmp/hr-no-such-file.jsonl --model m", h_.key_a());
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("cannot read"), std::string::npos) << missing.out;
  CliRun bad_request = run(
      h_, "submit " + write_file("bad.jsonl", {json{{"messages", 3}}}) + " --model " + h_.model(),
      h_.key_a());
  EXPECT_EQ(bad_request.code, 1);
  EXPECT_NE(bad_request.out.find("messages"), std::string::npos) << bad_request.out;
  CliRun unreachable = run(h_, "--url http://127.0.0.1:1 list", h_.key_a());
  EXPECT_EQ(unreachable.code, 1);
  EXPECT_NE(unreachable.out.find("cannot reach"), std::string::npos) << unreachable.out;
  EXPECT_EQ(std::count(unreachable.out.begin(), unreachable.out.end(), '\n'), 1);
}

}  // namespace
}  // namespace hr::cmd
