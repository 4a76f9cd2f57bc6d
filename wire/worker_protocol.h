// The internal protocol between the API's router (api/worker_router.h) and a standalone worker's
// sync endpoint (workers/sync_server.h): the JSON of a forwarded call and of its answer.
//   call:   {"request": <chat request JSON>, "stream": bool, "reject_if_busy": bool,
//            "queue_timeout_ms": int, "cache_namespace": "...", "flex"?: true,
//            "flex_timeout_ms"?: int}
//   answer: {"text", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
//            "logprobs"?: {"content": [...], "refusal": null} (when asked for), "tool_calls"?}
//   streamed: {"delta": "...", "logprobs"?: [entries]} lines, then {"answer": {...}} or
//            {"error": {"code", "message", "field"?, "retry_elsewhere"?}}
// Pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "base/status.h"
#include "wire/answer.h"
#include "wire/chat_request.h"

namespace hr::wire {

struct ForwardedCall {
  ChatRequest request;
  bool stream = false;
  bool reject_if_busy = false;
  int queue_timeout_ms = 2000;
  std::string cache_namespace;  // the account: its prompts alone share cached prefixes
  // service_tier "flex": run in the engine's async class, and give up (kResourceExhausted, field
  // service_tier) when generation has not started within flex_timeout_ms.
  bool flex = false;
  int flex_timeout_ms = 600000;
};

std::string encode_forwarded_call(const ForwardedCall& call);
// kInvalidArgument naming the field when the body is not a call.
[[nodiscard]] Result<ForwardedCall> decode_forwarded_call(std::string_view body);

nlohmann::json protocol_answer(const Answer& answer);
// kInternal when `j` is not an answer.
[[nodiscard]] Result<Answer> answer_from_protocol(const nlohmann::json& j);

// A streamed delta line (without its newline).
std::string protocol_delta_line(const std::string& delta, const Logprobs& logprobs,
                                const std::vector<ToolCallDelta>& calls = {});
// The tool-call pieces of a delta line ([] when it has none).
[[nodiscard]] Result<std::vector<ToolCallDelta>> delta_tool_calls_from_protocol(
    const nlohmann::json& line);

// {"error": {"code", "message", "field"?, "retry_elsewhere"?}}; retry_elsewhere: nothing of the
// call's answer left here (it never started, or the worker's engine failed before it answered),
// and another worker may take it.
nlohmann::json protocol_error(const Status& status, bool retry_elsewhere = false);
// The Status an error body carries, or kInternal naming the HTTP status when it carries none.
Status status_from_protocol_error(int http_status, const std::string& body);
// Whether an error body says another worker may take the call.
bool protocol_retry_elsewhere(const std::string& body);

}  // namespace hr::wire
