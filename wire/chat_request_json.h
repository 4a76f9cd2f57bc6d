// The chat request's own JSON: how the queue stores a request and how the API hands one to a
// remote worker. It is the shape the API's validation has always produced, so that requests
// queued by an earlier release still read:
//   {"messages": [{"role", "content"}...] | "prompt": "...", "max_tokens": N,
//    "temperature"?, "top_p"?, "top_k"?, "seed"?, "stop"?: [...], "frequency_penalty"?,
//    "presence_penalty"?, "repetition_penalty"?, "logit_bias"?: {"id": bias},
//    "logprobs"?: true, "top_logprobs"?: N, "tools"?: [{"type": "function", "function":
//    {"name", "description"?, "parameters"?}}], "tool_choice"?: "none" | "required" |
//    {"type": "function", "function": {"name"}}, "parallel_tool_calls"?: false,
//    "response_format"?: {"type": "json_object"} | {"type": "json_schema", "json_schema":
//    {"name", "schema", "strict"?}}}; an assistant message may carry "tool_calls" ([{"id", "type":
//    "function", "function": {"name", "arguments"}}]) and a tool message its "tool_call_id".
// Schemas ("parameters", "schema") are written as JSON text, which keeps the order of their keys
// (the order an answer's properties are generated in); an object is read as well.
// Pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include <string_view>

#include "base/status.h"
#include "wire/chat_request.h"

namespace hr::wire {

nlohmann::json to_json(const ChatRequest& request);
// The same, moving the request's strings into the JSON (for a request about to be stored).
nlohmann::json to_json(ChatRequest&& request);

// Reads the JSON above; a field of the wrong type is kInvalidArgument naming it. It trusts what
// the API validated (ranges are not checked again).
[[nodiscard]] Result<ChatRequest> chat_request_from_json(const nlohmann::json& j);
// The same from stored text.
[[nodiscard]] Result<ChatRequest> parse_chat_request(std::string_view text);

}  // namespace hr::wire
