// The stored answer: results that the release before the versioned form wrote (Workers AI's
// result JSON) must render exactly as that release rendered them; the versioned form round-trips
// and renders the same lines for the same answer. The expected lines below were produced by that
// release's own renderer (queue::append_result_line at 05cdb68) from these very rows.
#include "wire/stored_answer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "wire/openai_batch_lines.h"
#include "wire/workers_ai.h"

namespace hr::wire {
namespace {

using nlohmann::json;

const std::string kBatch = "11111111-2222-3333-4444-555555555555";
const std::string kModel = "@hr/tiny-reverse";

// Results as the worker of the earlier release stored them (json::dump: keys sorted).
const std::string kPlain =
    R"({"finish_reason":"stop","response":"olleh","usage":{"completion_tokens":5,"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":4},"total_tokens":17}})";
const std::string kWithLogprobs =
    R"({"finish_reason":"length","logprobs":{"content":[{"bytes":[104,105],"logprob":-0.25,"token":"hi","top_logprobs":[{"bytes":[104,105],"logprob":-0.25,"token":"hi"},{"bytes":[226,130],"logprob":-1.5,"token":"bytes:\\xe2\\x82"}]}],"refusal":null},"response":"hi","usage":{"completion_tokens":1,"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":0},"total_tokens":4}})";

std::vector<StoredResult> legacy_rows() {
  StoredResult a{0, "req-a", "completed", kPlain, std::nullopt, 1764201600};
  StoredResult b{1, std::nullopt, "completed", kWithLogprobs, std::nullopt, 1764201601};
  StoredResult c{2,
                 "req-c",
                 "failed",
                 std::nullopt,
                 R"({"code":"invalid_request","message":"logit_bias names token 9"})",
                 5};
  StoredResult d{3, "req-d", "cancelled", std::nullopt, std::nullopt, 0};
  StoredResult e{4, "req-e", "completed", R"({"foo":1})", std::nullopt, 0};
  return {a, b, c, d, e};
}

const std::string kExpectedOutput =
    std::string(
        R"golden({"id":"batch_req_11111111-2222-3333-4444-555555555555-0","custom_id":"req-a","response":{"status_code":200,"request_id":"req_11111111-2222-3333-4444-555555555555-0","body":{"id":"chatcmpl-11111111-2222-3333-4444-555555555555-0","object":"chat.completion","created":1764201600,"model":"@hr/tiny-reverse","choices":[{"index":0,"message":{"role":"assistant","content":"olleh"},"finish_reason":"stop","logprobs":null}],"usage":{"completion_tokens":5,"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":4},"total_tokens":17}}},"error":null})golden") +
    "\n" +
    R"golden({"id":"batch_req_11111111-2222-3333-4444-555555555555-1","custom_id":null,"response":{"status_code":200,"request_id":"req_11111111-2222-3333-4444-555555555555-1","body":{"id":"chatcmpl-11111111-2222-3333-4444-555555555555-1","object":"chat.completion","created":1764201601,"model":"@hr/tiny-reverse","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"length","logprobs":{"content":[{"bytes":[104,105],"logprob":-0.25,"token":"hi","top_logprobs":[{"bytes":[104,105],"logprob":-0.25,"token":"hi"},{"bytes":[226,130],"logprob":-1.5,"token":"bytes:\\xe2\\x82"}]}],"refusal":null}}],"usage":{"completion_tokens":1,"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":0},"total_tokens":4}}},"error":null})golden" +
    "\n";
const std::string kExpectedErrors =
    std::string(
        R"golden({"id":"batch_req_11111111-2222-3333-4444-555555555555-2","custom_id":"req-c","response":null,"error":{"code":"invalid_request","message":"logit_bias names token 9"}})golden") +
    "\n" +
    R"golden({"id":"batch_req_11111111-2222-3333-4444-555555555555-3","custom_id":"req-d","response":null,"error":{"code":"batch_cancelled","message":"the batch was cancelled before this request ran"}})golden" +
    "\n" +
    R"golden({"id":"batch_req_11111111-2222-3333-4444-555555555555-4","custom_id":"req-e","response":null,"error":{"code":"invalid_result","message":"the stored result is not a chat answer"}})golden" +
    "\n";

TEST(StoredAnswerTest, ResultsOfTheEarlierReleaseRenderAsItRenderedThem) {
  std::string out, err;
  for (const StoredResult& row : legacy_rows()) append_result_line(kBatch, kModel, row, &out, &err);
  EXPECT_EQ(out, kExpectedOutput);
  EXPECT_EQ(err, kExpectedErrors);
  // A poll shows them as they were stored.
  EXPECT_EQ(workers_ai_stored_result(kPlain).value(), json::parse(kPlain));
  EXPECT_EQ(workers_ai_stored_result(kWithLogprobs).value(), json::parse(kWithLogprobs));
}

TEST(StoredAnswerTest, TheVersionedFormRoundTripsAndRendersTheSameLines) {
  std::vector<StoredResult> rows = legacy_rows();
  for (int i : {0, 1}) {
    Result<Answer> a = decode_stored_answer(*rows[i].result_json);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    const std::string stored = encode_stored_answer(*a);
    EXPECT_EQ(json::parse(stored)["v"], 1);
    Result<Answer> back = decode_stored_answer(stored);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(encode_stored_answer(*back), stored);
    // The poll's result and the batch lines of the new form equal the earlier release's.
    EXPECT_EQ(workers_ai_stored_result(stored).value(), json::parse(*rows[i].result_json)) << i;
    rows[i].result_json = stored;
  }
  std::string out, err;
  for (const StoredResult& row : rows) append_result_line(kBatch, kModel, row, &out, &err);
  EXPECT_EQ(out, kExpectedOutput);
  EXPECT_EQ(err, kExpectedErrors);
}

TEST(StoredAnswerTest, KeepsEveryByteAndTheLowestLogprob) {
  Answer a;
  a.text = "h\xc3\xa9";
  a.finish_reason = "length";
  a.usage = {7, 2, 3};
  a.logprobs = std::vector<TokenLogprob>{
      {"h", -0.5f, {{"h", -0.5f}, {"\xc3", -std::numeric_limits<float>::infinity()}}},
      {"\xc3\xa9", -0.125f, {}}};
  Result<Answer> back = decode_stored_answer(encode_stored_answer(a));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->text, a.text);
  EXPECT_EQ(back->finish_reason, "length");
  EXPECT_EQ(back->usage.prompt_tokens, 7);
  EXPECT_EQ(back->usage.completion_tokens, 2);
  EXPECT_EQ(back->usage.cached_tokens, 3);
  ASSERT_TRUE(back->logprobs);
  ASSERT_EQ(back->logprobs->size(), 2u);
  EXPECT_EQ((*back->logprobs)[0].top[1].bytes, "\xc3");
  // -inf has no JSON number: the lowest float stands in.
  EXPECT_EQ((*back->logprobs)[0].top[1].logprob, -std::numeric_limits<float>::max());
  EXPECT_EQ((*back->logprobs)[1].bytes, "\xc3\xa9");
  EXPECT_EQ((*back->logprobs)[1].logprob, -0.125f);
  // Tool calls are kept.
  a.tool_calls = {{"call_9", "f", R"({"x":[1]})"}};
  back = decode_stored_answer(encode_stored_answer(a));
  ASSERT_TRUE(back.is_ok());
  ASSERT_EQ(back->tool_calls.size(), 1u);
  EXPECT_EQ(back->tool_calls[0].arguments, R"({"x":[1]})");
  a.tool_calls.clear();
  // Without logprobs asked for, none are stored, and none come back.
  a.logprobs.reset();
  back = decode_stored_answer(encode_stored_answer(a));
  ASSERT_TRUE(back.is_ok());
  EXPECT_FALSE(back->logprobs.has_value());
  EXPECT_FALSE(json::parse(encode_stored_answer(a)).contains("logprobs"));
}

TEST(StoredAnswerTest, RefusesWhatIsNotAnAnswerAndLaterVersions) {
  EXPECT_EQ(decode_stored_answer(R"({"foo":1})").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(decode_stored_answer("not json").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(decode_stored_answer(R"({"v":1})").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(decode_stored_answer(R"({"v":2,"text":"x"})").status().code(),
            StatusCode::kFailedPrecondition);
  // A poll shows an error for them, never a half-rendered result.
  EXPECT_EQ(workers_ai_stored_result(R"({"v":2,"text":"x"})").status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_FALSE(workers_ai_stored_result("[1").is_ok());
}

}  // namespace
}  // namespace hr::wire
