// One codec per external shape: Workers AI's result and events, OpenAI's chat.completion and
// chunks, and the router ↔ worker protocol, all from one native answer.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <limits>

#include "wire/json_text.h"
#include "wire/openai_chat.h"
#include "wire/worker_protocol.h"
#include "wire/workers_ai.h"

namespace hr::wire {
namespace {

using nlohmann::json;

Answer sample(bool with_logprobs) {
  Answer a;
  a.text = "cba";
  a.finish_reason = "length";
  a.usage = {5, 3, 2};
  if (with_logprobs) {
    a.logprobs = std::vector<TokenLogprob>{{"c", -0.5f, {{"c", -0.5f}, {"\xe2\x82", -2.0f}}},
                                           {"ba", -std::numeric_limits<float>::infinity(), {}}};
  }
  return a;
}

const json kUsage = {{"prompt_tokens", 5},
                     {"completion_tokens", 3},
                     {"total_tokens", 8},
                     {"prompt_tokens_details", {{"cached_tokens", 2}}}};

TEST(CodecsTest, WorkersAiResult) {
  const json plain = {{"response", "cba"}, {"usage", kUsage}};
  EXPECT_EQ(workers_ai_result(sample(false), false), plain);
  json queued = workers_ai_result(sample(true), true);
  EXPECT_EQ(queued["finish_reason"], "length");
  const json& content = queued["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_TRUE(queued["logprobs"]["refusal"].is_null());
  EXPECT_EQ(content[0]["token"], "c");
  EXPECT_EQ(content[0]["bytes"], json::array({99}));
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "bytes:\\xe2\\x82");  // not UTF-8 alone
  EXPECT_EQ(content[0]["top_logprobs"][1]["bytes"], json::array({226, 130}));
  EXPECT_EQ(content[1]["logprob"], -std::numeric_limits<float>::max());
  EXPECT_EQ(workers_ai_delta_event("cb", std::nullopt), "data: {\"response\":\"cb\"}\n\n");
  const json last = {{"response", ""}, {"usage", kUsage}, {"finish_reason", "length"}};
  EXPECT_EQ(workers_ai_final_event(sample(false)), "data: " + last.dump() + "\n\n");
}

// JSON mode: Workers AI answers the document as a value; the stored answer and the worker
// protocol keep the mark; OpenAI's shape keeps the text.
TEST(CodecsTest, JsonDocumentsAreValuesInWorkersAi) {
  Answer a = sample(false);
  a.text = R"({"name": "India", "languages": ["Hindi"]})";
  a.json = true;
  EXPECT_EQ(workers_ai_result(a, false)["response"],
            json({{"name", "India"}, {"languages", {"Hindi"}}}));
  Answer back = answer_from_protocol(protocol_answer(a)).value();
  EXPECT_TRUE(back.json);
  EXPECT_EQ(chat_completion(a, "id", 1, "m")["choices"][0]["message"]["content"], a.text);
  a.json = false;
  EXPECT_EQ(workers_ai_result(a, false)["response"], a.text);
  a.json = true;
  a.text = "{\"cut";  // not a document (an answer cut short): the text as it is
  EXPECT_EQ(workers_ai_result(a, false)["response"], a.text);
}

// Tool-call pieces cross the router <-> worker protocol with their delta.
TEST(CodecsTest, ToolCallPiecesCrossTheWorkerProtocol) {
  const std::vector<ToolCallDelta> calls = {{0, "call_1", "lookup", ""}, {0, "", "", "{\"q\""}};
  const json line = json::parse(protocol_delta_line("", std::nullopt, calls));
  const std::vector<ToolCallDelta> back = delta_tool_calls_from_protocol(line).value();
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].id, "call_1");
  EXPECT_EQ(back[0].name, "lookup");
  EXPECT_EQ(back[1].arguments, "{\"q\"");
  EXPECT_TRUE(back[1].id.empty());
  EXPECT_TRUE(delta_tool_calls_from_protocol(json::parse(protocol_delta_line("x", std::nullopt)))
                  .value()
                  .empty());
  EXPECT_FALSE(delta_tool_calls_from_protocol(json{{"tool_calls", {{{"id", "x"}}}}}).is_ok());
}

TEST(CodecsTest, OpenAiChatCompletionAndChunks) {
  nlohmann::ordered_json c = chat_completion(sample(false), "chatcmpl-1", 1700000000, "@hr/m");
  EXPECT_EQ(
      c.dump(),
      R"({"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"@hr/m",)"
      R"("choices":[{"index":0,"message":{"role":"assistant","content":"cba"},)"
      R"("finish_reason":"length","logprobs":null}],)"
      R"("usage":{"completion_tokens":3,"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":2},"total_tokens":8}})");
  std::string chunk = chat_chunk_event("chatcmpl-1", 7, "@hr/m", json{{"content", "c"}}, nullptr,
                                       nullptr, logprobs_object(sample(true).logprobs));
  ASSERT_TRUE(chunk.starts_with("data: ") && chunk.ends_with("\n\n"));
  json j = json::parse(chunk.substr(6));
  EXPECT_EQ(j["object"], "chat.completion.chunk");
  EXPECT_EQ(j["choices"][0]["delta"]["content"], "c");
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"].size(), 2u);
  EXPECT_FALSE(j.contains("usage"));
  json usage_only = json::parse(
      chat_chunk_event("chatcmpl-1", 7, "@hr/m", nullptr, nullptr, usage_json(sample(false).usage))
          .substr(6));
  EXPECT_TRUE(usage_only["choices"].empty());
  EXPECT_EQ(usage_only["usage"], kUsage);
}

TEST(CodecsTest, ToolCallsInEveryShape) {
  Answer a = sample(false);
  a.text = "";
  a.finish_reason = "tool_calls";
  a.tool_calls = {{"call_1", "get_weather", R"({"city":"Oslo"})"}};
  nlohmann::ordered_json c = chat_completion(a, "chatcmpl-1", 1, "m");
  EXPECT_TRUE(c["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(c["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            R"({"city":"Oslo"})");
  EXPECT_EQ(c["choices"][0]["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "tool_calls");
  json w = workers_ai_result(a, true);
  EXPECT_EQ(w["tool_calls"][0]["name"], "get_weather");
  EXPECT_EQ(w["tool_calls"][0]["arguments"], (json{{"city", "Oslo"}}));
  Result<Answer> back = answer_from_protocol(protocol_answer(a));
  ASSERT_TRUE(back.is_ok());
  ASSERT_EQ(back->tool_calls.size(), 1u);
  EXPECT_EQ(back->tool_calls[0].id, "call_1");
}

TEST(CodecsTest, WorkerProtocolRoundTrips) {
  for (bool lp : {false, true}) {
    Result<Answer> back = answer_from_protocol(protocol_answer(sample(lp)));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(protocol_answer(*back), protocol_answer(sample(lp)));
    EXPECT_EQ(back->logprobs.has_value(), lp);
  }
  EXPECT_FALSE(answer_from_protocol(json{{"answer", 1}}).is_ok());
  ForwardedCall call;
  call.request.prompt = "x";
  call.request.logprobs = true;
  call.stream = true;
  call.reject_if_busy = true;
  call.queue_timeout_ms = 7;
  call.cache_namespace = "0b6c1d8e-account";
  Result<ForwardedCall> decoded = decode_forwarded_call(encode_forwarded_call(call));
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  EXPECT_EQ(*decoded->request.prompt, "x");
  EXPECT_TRUE(decoded->request.logprobs);
  EXPECT_TRUE(decoded->stream);
  EXPECT_TRUE(decoded->reject_if_busy);
  EXPECT_EQ(decoded->queue_timeout_ms, 7);
  EXPECT_EQ(decoded->cache_namespace, "0b6c1d8e-account");
  EXPECT_EQ(decode_forwarded_call("{}").status().field(), "request");
  Status st = status_from_protocol_error(
      429, protocol_error(Status(StatusCode::kResourceExhausted, "full", "x"), true).dump());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(st.field(), "x");
  EXPECT_TRUE(protocol_retry_elsewhere(protocol_error(st, true).dump()));
  EXPECT_FALSE(protocol_retry_elsewhere(protocol_error(st).dump()));
}

}  // namespace
}  // namespace hr::wire
