// The chat request's own JSON: requests queued by the earlier release (the API's normalized JSON)
// read back, every field round-trips, and a malformed field is named.
#include "wire/chat_request_json.h"

#include <gtest/gtest.h>

namespace hr::wire {
namespace {

using nlohmann::json;

TEST(ChatRequestJsonTest, ReadsRequestsQueuedByTheEarlierRelease) {
  // As the earlier release's API stored them.
  Result<ChatRequest> r = parse_chat_request(
      R"({"logit_bias":{"5":10,"0":-100},"logprobs":true,"max_tokens":64,)"
      R"("messages":[{"content":"be brief","role":"system"},{"content":"reverse: hi","role":"user"}],)"
      R"("repetition_penalty":1.2,"seed":7,"stop":["x"],"temperature":0.7,"top_k":40,"top_logprobs":3,"top_p":0.9})");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "reverse: hi");
  EXPECT_FALSE(r->prompt);
  EXPECT_EQ(r->max_tokens, 64);
  EXPECT_EQ(*r->temperature, 0.7);
  EXPECT_EQ(*r->top_p, 0.9);
  EXPECT_EQ(*r->top_k, 40);
  EXPECT_EQ(*r->seed, 7u);
  EXPECT_EQ(*r->stop, std::vector<std::string>{"x"});
  EXPECT_EQ(*r->repetition_penalty, 1.2);
  EXPECT_FALSE(r->frequency_penalty);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 3);
  ASSERT_EQ(r->logit_bias.size(), 2u);
  EXPECT_EQ(r->logit_bias[0], (std::pair<int64_t, double>{0, -100}));
  EXPECT_EQ(r->logit_bias[1], (std::pair<int64_t, double>{5, 10}));
  // A bare prompt with nothing else: the worker's defaults apply.
  Result<ChatRequest> p = parse_chat_request(R"({"max_tokens":256,"prompt":"reverse: abc"})");
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(*p->prompt, "reverse: abc");
  EXPECT_TRUE(p->messages.empty());
  EXPECT_FALSE(p->temperature);
  EXPECT_FALSE(p->stop);
  EXPECT_FALSE(p->logprobs);
}

TEST(ChatRequestJsonTest, EveryFieldRoundTrips) {
  ChatRequest r;
  r.messages = {{"user", "a", {}, std::nullopt},
                {"assistant", "", {{"call_1", "f", R"({"x":1})"}}, std::nullopt},
                {"tool", "b", {}, "call_1"},
                {"user", "c", {}, std::nullopt}};
  r.tools = {{"f", "does f", R"({"type":"object"})"}, {"g", "", ""}};
  r.tool_choice = "none";
  r.parallel_tool_calls = false;
  r.max_tokens = 9;
  r.temperature = 0.25;
  r.top_p = 0.5;
  r.top_k = 3;
  r.seed = 18446744073709551615ull;
  r.stop = std::vector<std::string>{};
  r.frequency_penalty = 0.5;
  r.presence_penalty = -0.5;
  r.repetition_penalty = 1.5;
  r.logit_bias = {{1, 2.5}, {7, -1}};
  r.logprobs = true;
  r.top_logprobs = 20;
  const json j = to_json(r);
  Result<ChatRequest> back = chat_request_from_json(j);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(to_json(*back), j);
  EXPECT_EQ(*back->seed, r.seed);
  EXPECT_EQ(back->messages[1].tool_calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(*back->messages[2].tool_call_id, "call_1");
  EXPECT_EQ(back->tools[0].parameters, R"({"type":"object"})");
  EXPECT_EQ(back->tool_choice, "none");
  EXPECT_FALSE(back->parallel_tool_calls);
  EXPECT_EQ(j["stop"], json::array());  // given, even empty
  ChatRequest bare;
  bare.prompt = "x";
  EXPECT_EQ(to_json(bare), (json{{"prompt", "x"}, {"max_tokens", 256}}));
}

TEST(ChatRequestJsonTest, NamesTheMalformedField) {
  struct Case {
    const char* text;
    const char* field;
  } cases[] = {
      {"[]", "body"},
      {"not json", "body"},
      {R"({"max_tokens":1})", "prompt"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"prompt":"x","max_tokens":"9"})", "max_tokens"},
      {R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {R"({"prompt":"x","seed":-1})", "seed"},
      {R"({"prompt":"x","stop":[1]})", "stop"},
      {R"({"prompt":"x","logit_bias":{"a":1}})", "logit_bias.a"},
      {R"({"prompt":"x","logit_bias":{"1":"b"}})", "logit_bias.1"},
      {R"({"prompt":"x","logprobs":1})", "logprobs"},
  };
  for (const Case& c : cases) {
    Result<ChatRequest> r = parse_chat_request(c.text);
    ASSERT_FALSE(r.is_ok()) << c.text;
    EXPECT_EQ(r.status().field(), c.field) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.text;
  }
}

}  // namespace
}  // namespace hr::wire
