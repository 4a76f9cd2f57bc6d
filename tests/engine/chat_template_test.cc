// A model's chat template: its own (Jinja) from its folder, rendering the bundled model's
// conversations exactly as its built-in format does; the built-ins by name; and clear errors for
// a folder without a template, a template that does not parse, and a conversation it refuses.
#include "engine/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace hr::engine {
namespace {

namespace fs = std::filesystem;

const std::string kTiny = std::string(HEADROOM_SOURCE_DIR) + "/models/tiny-reverse";

// A scratch model folder with the given files.
std::string folder(const std::string& name,
                   const std::vector<std::pair<std::string, std::string>>& files) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("chat_template_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& [file, text] : files) std::ofstream(dir / file) << text;
  return dir.string();
}

TEST(ChatTemplateTest, TheBundledModelsOwnTemplateRendersAsItsBuiltInFormat) {
  Result<ChatTemplate> own = ChatTemplate::load(kTiny);
  ASSERT_TRUE(own.is_ok()) << own.status().to_string();
  EXPECT_TRUE(own->is_models_own());
  const ChatTemplate builtin = ChatTemplate::builtin(ChatFormat::kHeadroom);
  const std::vector<std::vector<ChatMessage>> conversations = {
      {{"user", "reverse: hello"}},
      {{"user", "reverse: ab"}, {"assistant", "ba"}, {"user", "reverse: xyz é"}},
  };
  for (const auto& c : conversations) {
    Result<std::string> a = own->render(c, "<s>", "</s>");
    Result<std::string> b = builtin.render(c, "<s>", "</s>");
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    EXPECT_EQ(*a, *b);
  }
  EXPECT_EQ(*own->render({{"user", "reverse: hi"}}, "<s>", "</s>"),
            "<s><|user|>reverse: hi<|assistant|>");
  // Its template has no system role and leaves such messages out; the built-in refused them.
  EXPECT_EQ(*own->render({{"system", "be brief"}, {"user", "x"}}, "<s>", "</s>"),
            "<s><|user|>x<|assistant|>");
}

TEST(ChatTemplateTest, FindsTheTemplateWhereTransformersKeepsIt) {
  // chat_template.jinja wins over tokenizer_config.json; a list's "default" entry is used.
  const std::string both =
      folder("both", {{"chat_template.jinja", "[{{ messages[0].content }}]"},
                      {"tokenizer_config.json", R"({"chat_template": "ignored"})"}});
  EXPECT_EQ(*ChatTemplate::load(both)->render({{"user", "a"}}, "", ""), "[a]");
  const std::string listed = folder(
      "listed",
      {{"tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"},)"
                                 R"( {"name": "default", "template": "D{{ eos_token }}"}]})"}});
  EXPECT_EQ(*ChatTemplate::load(listed)->render({{"user", "a"}}, "<s>", "</s>"), "D</s>");
  // An override picks a built-in format even when the folder has a template.
  Result<ChatTemplate> chatml = ChatTemplate::load(both, "chatml");
  ASSERT_TRUE(chatml.is_ok());
  EXPECT_FALSE(chatml->is_models_own());
  EXPECT_EQ(*chatml->render({{"user", "hi"}}, "", ""),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

// A real template (Qwen2.5's) gets the tools, the assistant's calls and the tool's result.
TEST(ChatTemplateTest, TheModelsTemplateGetsToolsCallsAndResults) {
  using ojson = nlohmann::ordered_json;
  std::ifstream in(std::string(HEADROOM_SOURCE_DIR) +
                   "/tests/data/chat_templates/Qwen--Qwen2.5-7B-Instruct.jinja");
  std::stringstream ss;
  ss << in.rdbuf();
  Result<ChatTemplate> qwen =
      ChatTemplate::load(folder("qwen", {{"chat_template.jinja", ss.str()}}));
  ASSERT_TRUE(qwen.is_ok()) << qwen.status().to_string();
  EXPECT_EQ(qwen->tool_call_format(), ToolCallFormat::kHermes);
  const ojson messages = ojson::parse(R"([
    {"role": "user", "content": "weather in Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}])");
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "The weather", "parameters": {"type": "object"}}}])");
  Result<std::string> text = qwen->render(messages, tools, "", "<|im_end|>");
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_NE(text->find("\"name\": \"get_weather\""), std::string::npos) << *text;
  EXPECT_NE(
      text->find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"),
      std::string::npos)
      << *text;
  EXPECT_NE(text->find("<tool_response>\n12 C\n</tool_response>"), std::string::npos) << *text;
  // A built-in format takes neither.
  const ChatTemplate builtin = ChatTemplate::builtin(ChatFormat::kChatMl);
  EXPECT_EQ(builtin.render(messages, nullptr, "", "").status().field(), "messages[1]");
  EXPECT_EQ(builtin.render(ojson::parse(R"([{"role": "user", "content": "x"}])"), tools, "", "")
                .status()
                .field(),
            "tools");
}

TEST(ChatTemplateTest, ErrorsSayWhatIsWrongAndWhere) {
  Result<ChatTemplate> none = ChatTemplate::load(folder("none", {{"tokenizer_config.json", "{}"}}));
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().field(), "chat-template");
  Result<ChatTemplate> broken =
      ChatTemplate::load(folder("broken", {{"chat_template.jinja", "ok\n{% if %}\n"}}));
  ASSERT_FALSE(broken.is_ok());
  EXPECT_NE(broken.status().message().find("line 2"), std::string::npos)
      << broken.status().message();
  Result<ChatTemplate> strict = ChatTemplate::load(folder(
      "strict",
      {{"chat_template.jinja",
        "{% for m in messages %}{% if m.role == 'system' %}"
        "{{ raise_exception('System messages are not supported') }}{% endif %}{% endfor %}"}}));
  ASSERT_TRUE(strict.is_ok());
  Result<std::string> refused = strict->render({{"system", "x"}}, "", "");
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("System messages are not supported"),
            std::string::npos);
  EXPECT_EQ(ChatTemplate::load(kTiny, "nonsense").status().field(), "chat-template");
}

}  // namespace
}  // namespace hr::engine
