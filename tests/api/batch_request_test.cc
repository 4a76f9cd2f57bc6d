// Request validation and normalization, without servers.
#include "api/batch_request.h"

#include <gtest/gtest.h>

#include "api/api.h"
#include "base/duration.h"
#include "wire/chat_request_json.h"

namespace hr::api {
namespace {

using nlohmann::json;

const ModelSpec kModel{"@hr/tiny-reverse", 128};

// A request as normalize_chat_request() takes it, in its stored form (wire/chat_request_json.h).
Result<json> normalized(const json& req) {
  HR_ASSIGN_OR_RETURN(wire::ChatRequest r, normalize_chat_request(req, kModel, {}));
  return wire::to_json(r);
}

TEST(BatchRequestTest, NormalizesWithDefaults) {
  auto r = normalized(
      json{{"messages", {{{"role", "user"}, {"content", "reverse: hi"}}}}, {"stop", "x"}});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ((*r)["max_tokens"], 128);
  EXPECT_FALSE(r->contains("temperature"));  // sampling defaults belong to the worker
  EXPECT_EQ((*r)["stop"], json::array({"x"}));
  EXPECT_EQ((*r)["messages"][0]["content"], "reverse: hi");
}

// OpenAI's content parts: text parts are joined with newlines into the message's text.
TEST(BatchRequestTest, TextContentPartsBecomeTheMessagesText) {
  json parts =
      json::array({{{"type", "text"}, {"text", "reverse: "}}, {{"type", "text"}, {"text", "hi"}}});
  auto r = normalized(json{{"messages", {{{"role", "user"}, {"content", parts}}}}});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ((*r)["messages"][0]["content"], "reverse: \nhi");
}

// Penalties are stored only when they do something; the worker reads them from there.
TEST(BatchRequestTest, PenaltiesThatChangeSomethingAreStored) {
  auto r = normalized(json{{"prompt", "x"},
                           {"frequency_penalty", 0.5},
                           {"presence_penalty", 0},
                           {"repetition_penalty", 1.2}});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ((*r)["frequency_penalty"], 0.5);
  EXPECT_FALSE(r->contains("presence_penalty"));
  EXPECT_EQ((*r)["repetition_penalty"], 1.2);
  auto none = normalized(
      json{{"prompt", "x"}, {"repetition_penalty", 1}, {"logprobs", false}, {"top_logprobs", 0}});
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->contains("repetition_penalty"));
  EXPECT_FALSE(none->contains("logprobs"));  // asking for none is fine, and not stored
  auto lp = normalized(json{{"prompt", "x"}, {"logprobs", true}, {"top_logprobs", 4}});
  ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
  EXPECT_EQ((*lp)["logprobs"], true);
  EXPECT_EQ((*lp)["top_logprobs"], 4);
  auto lb = normalized(json{{"prompt", "x"}, {"logit_bias", {{"5", 10}, {"0", -100}, {"7", 0}}}});
  ASSERT_TRUE(lb.is_ok()) << lb.status().to_string();
  EXPECT_EQ((*lb)["logit_bias"], (json{{"5", 10}, {"0", -100}}));  // a zero bias changes nothing
}

// Tools in OpenAI's and Workers AI's shapes, calls and results in the conversation.
TEST(BatchRequestTest, ToolsCallsAndResultsAreKept) {
  auto r = normalized(json{
      {"messages",
       {{{"role", "user"}, {"content", "weather in Oslo?"}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"tool_calls",
          {{{"id", "call_1"},
            {"type", "function"},
            {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Oslo"})"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "12 C"}}}},
      {"tools",
       {{{"type", "function"},
         {"function",
          {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}, {"description", "d"}}}},
        {{"name", "search"}}}},
      {"tool_choice", "auto"}});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ((*r)["messages"][1]["content"], "");
  EXPECT_EQ((*r)["messages"][1]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ((*r)["messages"][2]["tool_call_id"], "call_1");
  EXPECT_EQ(json::parse((*r)["tools"][0]["function"]["parameters"].get<std::string>()),
            (json{{"type", "object"}}));
  EXPECT_EQ((*r)["tools"][1]["function"]["name"], "search");
  EXPECT_FALSE(r->contains("tool_choice"));  // auto is the default
}

TEST(BatchRequestTest, NamesTheBadField) {
  struct Case {
    json req;
    std::string field;
  } cases[] = {
      {json::array(), ""},
      {json{{"prompt", 3}}, "prompt"},
      {json{{"prompt", ""}}, "prompt"},
      {json{{"messages", json::array()}}, "messages"},
      {json{{"messages", {{{"role", "user"}}}}}, "messages[0].content"},
      {json{{"messages", {{{"role", "user"}, {"content", json::array()}}}}}, "messages[0].content"},
      {json{{"messages",
             {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}},
       "messages[0].content[0].type"},
      {json{{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", 1}}}}}}}},
       "messages[0].content[0].text"},
      {json{{"prompt", "x"}, {"frequency_penalty", 2.5}}, "frequency_penalty"},
      {json{{"prompt", "x"}, {"presence_penalty", "1"}}, "presence_penalty"},
      {json{{"prompt", "x"}, {"repetition_penalty", 0}}, "repetition_penalty"},
      {json{{"prompt", "x"}, {"logprobs", 1}}, "logprobs"},
      {json{{"prompt", "x"}, {"logit_bias", json::array()}}, "logit_bias"},
      {json{{"prompt", "x"}, {"logit_bias", {{"01", 1}}}}, "logit_bias.01"},
      {json{{"prompt", "x"}, {"logit_bias", {{"-1", 1}}}}, "logit_bias.-1"},
      {json{{"prompt", "x"}, {"logit_bias", {{"9999999999", 1}}}}, "logit_bias.9999999999"},
      {json{{"prompt", "x"}, {"logit_bias", {{"3", 101}}}}, "logit_bias.3"},
      {json{{"prompt", "x"}, {"logit_bias", {{"3", "1"}}}}, "logit_bias.3"},
      {json{{"prompt", "x"}, {"top_logprobs", 3}}, "top_logprobs"},
      {json{{"prompt", "x"}, {"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {json{{"prompt", "x"}, {"top_p", 0}}, "top_p"},
      {json{{"prompt", "x"}, {"top_k", -1}}, "top_k"},
      {json{{"prompt", "x"}, {"seed", 1.5}}, "seed"},
      {json{{"prompt", "x"}, {"stop", {"a", "b", "c", "d", "e"}}}, "stop"},
      {json{{"prompt", "x"}, {"stream", true}}, "stream"},
      {json{{"prompt", "x"}, {"model", "@other/model"}}, "model"},
      {json{{"prompt", "x"}, {"max_tokens", 0}}, "max_tokens"},
      {json{{"prompt", "x"}, {"tools", "f"}}, "tools"},
      {json{{"prompt", "x"},
            {"tools", {{{"type", "function"}, {"function", {{"name", "bad name"}}}}}}},
       "tools[0].function.name"},
      {json{
           {"prompt", "x"},
           {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "x"}}}}}}},
       "tools[0].function.parameters"},
      {json{{"prompt", "x"}, {"tools", {{{"name", "f"}}, {{"name", "f"}}}}}, "tools[1].name"},
      {json{{"prompt", "x"}, {"tool_choice", "sometimes"}}, "tool_choice"},
      {json{{"prompt", "x"}, {"tool_choice", "required"}}, "tool_choice"},
      {json{{"prompt", "x"},
            {"tools",
             {{{"name", "f"},
               {"parameters",
                {{"type", "object"},
                 {"properties", {{"d", {{"type", "string"}, {"format", "date"}}}}}}}}}},
            {"tool_choice", "required"}},
       "tools[0].function.parameters.properties.d.format"},
      {json{{"prompt", "x"}, {"response_format", {{"type", "xml"}}}}, "response_format.type"},
      {json{{"prompt", "x"}, {"response_format", {{"type", "json_schema"}}}},
       "response_format.json_schema"},
      {json{{"prompt", "x"},
            {"response_format",
             {{"type", "json_schema"},
              {"json_schema",
               {{"name", "n"},
                {"schema",
                 {{"type", "object"},
                  {"properties", {{"a", {{"type", "integer"}, {"multipleOf", 2}}}}}}}}}}}},
       "response_format.json_schema.schema.properties.a.multipleOf"},
      {json{{"prompt", "x"},
            {"response_format",
             {{"type", "json_schema"},
              {"json_schema", {{"type", "object"}, {"oneOf", json::array({json::object()})}}}}}},
       "response_format.json_schema.oneOf"},
      {json{{"prompt", "x"},
            {"tools", {{{"name", "f"}}}},
            {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}},
       "tool_choice.function.name"},
      {json{{"messages", {{{"role", "tool"}, {"content", "42"}}}}}, "messages[0].tool_call_id"},
      {json{{"messages", {{{"role", "user"}, {"content", "x"}, {"tool_calls", json::array()}}}}},
       "messages[0].tool_calls"},
      {json{{"messages",
             {{{"role", "assistant"},
               {"tool_calls",
                {{{"id", "c1"}, {"function", {{"name", "f"}, {"arguments", "[1]"}}}}}}}}}},
       "messages[0].tool_calls[0].function.arguments"},
  };
  for (const auto& c : cases) {
    auto r = normalized(c.req);
    ASSERT_FALSE(r.is_ok()) << c.req.dump();
    EXPECT_EQ(r.status().field(), c.field) << c.req.dump();
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
}

// response_format in OpenAI's shape and in Workers AI's, and tool_choice required or named, come
// through to the stored request and back.
TEST(BatchRequestTest, ConstraintsRoundTrip) {
  json schema = {
      {"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}, {"required", {"a"}}};
  auto openai = normalized(
      json{{"prompt", "x"},
           {"response_format",
            {{"type", "json_schema"},
             {"json_schema", {{"name", "thing"}, {"schema", schema}, {"strict", true}}}}}});
  ASSERT_TRUE(openai.is_ok()) << openai.status().message();
  auto back = wire::chat_request_from_json(openai.value());
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(back.value().response_format.type, wire::ResponseFormat::Type::kJsonSchema);
  EXPECT_EQ(back.value().response_format.name, "thing");
  EXPECT_TRUE(back.value().response_format.strict);
  EXPECT_EQ(json::parse(back.value().response_format.schema), schema);
  auto workers_ai = normalized(json{
      {"prompt", "x"}, {"response_format", {{"type", "json_schema"}, {"json_schema", schema}}}});
  ASSERT_TRUE(workers_ai.is_ok()) << workers_ai.status().message();
  EXPECT_EQ(
      json::parse((*workers_ai)["response_format"]["json_schema"]["schema"].get<std::string>()),
      schema);
  auto object = normalized(json{{"prompt", "x"}, {"response_format", {{"type", "json_object"}}}});
  ASSERT_TRUE(object.is_ok());
  EXPECT_EQ((*object)["response_format"], json({{"type", "json_object"}}));
  auto named =
      normalized(json{{"prompt", "x"},
                      {"tools", {{{"name", "f"}}, {{"name", "g"}}}},
                      {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}});
  ASSERT_TRUE(named.is_ok()) << named.status().message();
  auto named_back = wire::chat_request_from_json(named.value());
  ASSERT_TRUE(named_back.is_ok());
  EXPECT_EQ(named_back.value().tool_choice, "function");
  EXPECT_EQ(named_back.value().tool_choice_function, "g");
}

// A schema's keys keep the client's order (the answer's properties are generated in it), though
// the request is otherwise read into sorted JSON.
TEST(BatchRequestTest, SchemasKeepTheClientsKeyOrder) {
  const std::string text =
      R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n",
      "schema": {"type": "object", "properties": {"zeta": {"type": "string"},
      "alpha": {"type": "integer"}}, "required": ["zeta", "alpha"]}}},
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"second": {"type": "null"}, "first": {"type": "null"}}}}}]})";
  auto ordered = ordered_schemas(text);
  ASSERT_NE(ordered, nullptr);
  auto r = normalize_chat_request(json::parse(text), kModel, {}, ordered.get());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const std::string& schema = r.value().response_format.schema;
  EXPECT_LT(schema.find("zeta"), schema.find("alpha")) << schema;
  const std::string& params = r.value().tools[0].parameters;
  EXPECT_LT(params.find("second"), params.find("first")) << params;
  // Stored and read back, the order holds.
  auto back = wire::chat_request_from_json(wire::to_json(r.value()));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(back.value().response_format.schema, schema);
  EXPECT_EQ(back.value().tools[0].parameters, params);
  EXPECT_EQ(ordered_schemas(R"({"prompt": "no schema here"})"), nullptr);
}

// A prompt longer than the model's context could hold (context × kMaxBytesPerToken bytes) is
// refused at submit naming its field, in either form; one byte less is accepted.
TEST(BatchRequestTest, PromptsTooLongForTheContextAreRefused) {
  const size_t most = 128 * kMaxBytesPerToken;
  auto fits = normalized(json{{"prompt", std::string(most, 'x')}});
  EXPECT_TRUE(fits.is_ok()) << fits.status().to_string();
  auto prompt = normalized(json{{"prompt", std::string(most + 1, 'x')}});
  ASSERT_FALSE(prompt.is_ok());
  EXPECT_EQ(prompt.status().field(), "prompt");
  EXPECT_NE(prompt.status().message().find("context of 128 tokens"), std::string::npos)
      << prompt.status().message();
  // Counted over every message and the arguments of earlier tool calls.
  json msgs = json::array();
  msgs.push_back({{"role", "system"}, {"content", std::string(most / 2, 's')}});
  msgs.push_back(
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "c1"},
          {"type", "function"},
          {"function",
           {{"name", "f"}, {"arguments", "{\"a\": \"" + std::string(most / 2, 'a') + "\"}"}}}}}}});
  msgs.push_back({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}});
  auto messages = normalized(json{{"messages", msgs}});
  ASSERT_FALSE(messages.is_ok());
  EXPECT_EQ(messages.status().field(), "messages");
  // The 5 MB prompt that was once stored and then failed in the worker.
  json batch = {{"requests", {{{"prompt", "ok"}}, {{"prompt", std::string(5 << 20, 'p')}}}}};
  std::vector<queue::NewRequest> out;
  auto err = parse_batch(batch, kModel, {}, &out);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->index, 1);
  EXPECT_EQ(err->status.field(), "requests[1].prompt");
}

TEST(BatchRequestTest, BatchErrorsCarryIndexAndPath) {
  std::vector<queue::NewRequest> out;
  auto err =
      parse_batch(json{{"requests", {{{"prompt", "ok"}}, {{"prompt", "ok"}, {"top_k", "x"}}}}},
                  kModel, {}, &out);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->index, 1);
  EXPECT_EQ(err->status.field(), "requests[1].top_k");
  auto ok =
      parse_batch(json{{"requests", {{{"prompt", "a"}, {"custom_id", "c"}}, {{"prompt", "b"}}}}},
                  kModel, {}, &out);
  EXPECT_FALSE(ok.has_value());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(*out[0].custom_id, "c");
  EXPECT_FALSE(out[1].custom_id.has_value());
}

TEST(BatchRequestTest, Durations) {
  EXPECT_EQ(parse_duration_ms("24h", "w").value(), 86400000);
  EXPECT_EQ(parse_duration_ms("90m", "w").value(), 5400000);
  EXPECT_EQ(parse_duration_ms("2s", "w").value(), 2000);
  EXPECT_FALSE(parse_duration_ms("h", "w").is_ok());
  EXPECT_FALSE(parse_duration_ms("10x", "w").is_ok());
  EXPECT_FALSE(parse_duration_ms("-1h", "w").is_ok());
  EXPECT_FALSE(parse_duration_ms("30d", "w").is_ok());
  EXPECT_FALSE(
      parse_duration_ms(std::string(400, '9') + "h", "w").is_ok());  // no overflow on the way
  EXPECT_EQ(parse_duration_ms("7d", "w").value(), 7 * 86400000LL);
}

}  // namespace
}  // namespace hr::api
