// The chat-template interpreter (engine/jinja/template.h): any template text parsed, and one that
// parses rendered with a conversation that has a system prompt, tools, an assistant's tool call
// and its result.
#include <cstdint>
#include <string_view>

#include "engine/jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true,
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
      {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]}}}]})");
  auto tmpl = hr::engine::jinja::Template::parse(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!tmpl.is_ok()) return 0;
  (void)tmpl->render(context);
  return 0;
}
