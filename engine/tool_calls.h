// Tool calls in a model's output, per model family: which format a model writes them in (known
// from its chat template) and how to read them back out of its answer. Pure functions.
//   kHermes  (Hermes, Qwen 2.5/3):  <tool_call>{"name": ..., "arguments": {...}}</tool_call>...
//   kMistral (Mistral v0.3, Nemo):  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
//   kLlama3  (Llama 3.1/3.2/3.3):   {"name": ..., "parameters": {...}} (the whole answer, after an
//                                   optional <|python_tag|>; several separated by ;)
//   kDeepSeek (DeepSeek V3, R1):
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//                                   ```json {...} ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   kKimi    (Kimi K2):             <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
//                                   <|tool_call_argument_begin|>{...}<|tool_call_end|>...
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace hr::engine {

enum class ToolCallFormat { kNone, kHermes, kMistral, kLlama3, kDeepSeek, kKimi };

// The format a chat template's model writes calls in, from the template's own markers; kNone
// when it shows none.
ToolCallFormat detect_tool_call_format(const std::string& chat_template);
const char* tool_call_format_name(ToolCallFormat format);

struct ParsedCall {
  std::string name;
  std::string arguments;  // JSON text of an object
};

struct ParsedAnswer {
  std::string text;  // what remains of the answer outside the calls
  std::vector<ParsedCall> calls;
};

// How much of an answer streamed so far (`text`) may go out before it is known whether a call
// begins there: everything before the first place a call could start (a marker, or the start of
// a partial one at the end); for Llama 3, nothing while the answer could still be a call (it
// starts with "{" or <|python_tag|>), else all of it. Never less as `text` grows.
size_t streamable_prefix(ToolCallFormat format, const std::string& text);

// The calls in `answer`, and its text without them. An answer with no well-formed call comes back
// whole, with no calls.
ParsedAnswer parse_tool_calls(ToolCallFormat format, const std::string& answer);

}  // namespace hr::engine
