// Workers AI's shapes of an answer: the result of POST /ai/run/{model} (and of each request in a
// queued batch's poll), and its server-sent events when streamed. Pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "base/status.h"
#include "wire/answer.h"

namespace hr::wire {

// {"response": text, "usage": {...}, "tool_calls"?: [{"name", "arguments"}], "finish_reason"?,
// "logprobs"?} (finish_reason with
// `with_finish_reason`: the queued results carry it, the sync answer does not).
nlohmann::json workers_ai_result(const Answer& answer, bool with_finish_reason);

// A stored result (wire/stored_answer.h) as a poll shows it. A result stored by an earlier release
// (Workers AI's result itself) shows as it was stored. kInvalidArgument for text that is not a
// stored answer, kFailedPrecondition for a later version than this release reads.
[[nodiscard]] Result<nlohmann::json> workers_ai_stored_result(std::string_view stored);

// One streamed piece: data: {"response": delta, "logprobs"?: {"content": [...], "refusal": null}}
std::string workers_ai_delta_event(const std::string& delta, const Logprobs& logprobs);
// The last event before [DONE]: data: {"response": "", "usage": {...}, "finish_reason": ...,
// "tool_calls"?: [{"name", "arguments"}]}
std::string workers_ai_final_event(const Answer& answer);

}  // namespace hr::wire
