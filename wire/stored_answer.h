// The answer as the queue stores it: a neutral, versioned JSON document that no route's shape
// leaks into; the codecs render it for each route.
//   version 1: {"v": 1, "text": "...", "finish_reason": "stop",
//               "usage": {"prompt_tokens", "completion_tokens", "cached_tokens"},
//               "logprobs"?: [{"token", "logprob", "bytes", "top_logprobs"}...],
//               "tool_calls"?: [{"id", "type": "function", "function": {"name", "arguments"}}]}
// (the logprobs entries keep each token's bytes, so nothing is lost). Results stored by earlier
// releases are Workers AI's result ({"response", "usage", "finish_reason", "logprobs"}); they are
// read too. Pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "base/status.h"
#include "wire/answer.h"

namespace hr::wire {

constexpr int kStoredAnswerVersion = 1;

std::string encode_stored_answer(const Answer& answer);

// Version 1, or an earlier release's result. kInvalidArgument when it is neither (the text is not
// a chat answer); kFailedPrecondition for a later version than this release reads.
[[nodiscard]] Result<Answer> decode_stored_answer(std::string_view stored);

// The same from parsed JSON.
[[nodiscard]] Result<Answer> decode_stored_answer_json(const nlohmann::json& stored);

}  // namespace hr::wire
