// The native chat request: what a client asked for once its JSON has been validated
// (api/batch_request.h), in every route's shape. Workers turn it into the engine's request; the
// queue stores it as JSON (wire/chat_request_json.h). Fields the client left out stay unset, so
// that the worker's defaults apply and the stored form holds only what was asked.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hr::wire {

// A function the model called (in an answer), or called earlier in the conversation.
struct ToolCall {
  std::string id;         // call_...
  std::string name;       // the function's name
  std::string arguments;  // JSON text of an object
};

struct ChatMessage {
  std::string role;  // system, user, assistant, tool, developer
  std::string content;
  std::vector<ToolCall> tool_calls;         // assistant: the calls it made
  std::optional<std::string> tool_call_id;  // tool: the call this message answers
};

// A function the model may call (OpenAI's {"type": "function", "function": {...}}).
struct Tool {
  std::string name;
  std::string description;
  std::string parameters;  // JSON Schema text of an object ("" when none was given)
};

// OpenAI's response_format (Workers AI's too): free text, any JSON object, or a document valid
// against a JSON Schema.
struct ResponseFormat {
  enum class Type { kText, kJsonObject, kJsonSchema };
  Type type = Type::kText;
  std::string name;    // kJsonSchema: the schema's name (OpenAI's json_schema.name)
  std::string schema;  // kJsonSchema: JSON Schema text
  bool strict = false;
};

struct ChatRequest {
  // Exactly one of the two: a conversation, or a bare prompt (sent as one user message).
  std::vector<ChatMessage> messages;
  std::optional<std::string> prompt;

  int max_tokens = 256;
  std::optional<double> temperature;  // worker default 0.6
  std::optional<double> top_p;        // worker default 1
  std::optional<int> top_k;           // 0: off
  std::optional<uint64_t> seed;
  std::optional<std::vector<std::string>> stop;
  // OpenAI's penalties over the answer so far, and transformers' over prompt and answer; set only
  // when they change anything (0, 0 and 1 are off).
  std::optional<double> frequency_penalty;
  std::optional<double> presence_penalty;
  std::optional<double> repetition_penalty;
  // Token id → bias added to its logit, in the order given; ids are checked by the worker, which
  // knows the vocabulary.
  std::vector<std::pair<int64_t, double>> logit_bias;
  // OpenAI's log probabilities: each answer token's, with `top_logprobs` (0..20) alternatives.
  bool logprobs = false;
  int top_logprobs = 0;
  // Functions the model may call, and whether it may or must: tool_choice "auto" (the default),
  // "none" (the tools are not offered), "required" (the answer is one or more calls) or
  // "function" (the answer calls tool_choice_function).
  std::vector<Tool> tools;
  std::string tool_choice = "auto";
  std::string tool_choice_function;
  ResponseFormat response_format;
  bool parallel_tool_calls = true;
};

// Whether the answer is a JSON document (response_format json_object or json_schema, and no call
// that tool_choice requires).
inline bool answers_json(const ChatRequest& r) {
  return r.response_format.type != ResponseFormat::Type::kText && r.tool_choice != "required" &&
         r.tool_choice != "function";
}

}  // namespace hr::wire
