// OpenAI's chat shapes of an answer: the usage object (Workers AI uses the same), log
// probabilities, chat.completion and chat.completion.chunk. The one place these are built.
// Pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "wire/answer.h"

namespace hr::wire {

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
// {"cached_tokens"}}
nlohmann::json usage_json(const Usage& usage);
// Reads usage_json() back (missing counts are 0).
Usage usage_from_json(const nlohmann::json& j);

// A token's entry in OpenAI's logprobs content: {"token", "logprob", "bytes", "top_logprobs"}.
// `token` is the text, or "bytes:\xHH..." where the bytes are not UTF-8 on their own; a logprob of
// -inf (which JSON cannot hold) is the lowest float.
nlohmann::json logprob_entry(const TokenLogprob& t);
nlohmann::json logprob_entries(const std::vector<TokenLogprob>& tokens);
// Reads entries back from their bytes and log probabilities; kInvalidArgument when malformed.
[[nodiscard]] Result<std::vector<TokenLogprob>> logprob_entries_from_json(const nlohmann::json& j);
// {"content": [entries], "refusal": null}, or null when none were asked for.
nlohmann::json logprobs_object(const Logprobs& logprobs);

// OpenAI's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls);
// Reads tool_calls_json() back (also the stored and protocol forms, which share it).
[[nodiscard]] Result<std::vector<ToolCall>> tool_calls_from_json(const nlohmann::json& j);

// The response of POST /v1/chat/completions, in OpenAI's field order. With tool calls, the message
// carries them (and content null when the answer has no text).
nlohmann::ordered_json chat_completion(const Answer& answer, const std::string& id, int64_t created,
                                       const std::string& model);

// One streamed chat.completion.chunk as a server-sent event ("data: {...}\n\n"). `delta` null:
// a chunk without choices (the usage chunk); `usage` null: none.
// `service_tier`, when given, is echoed in the chunk (OpenAI's field).
std::string chat_chunk_event(const std::string& id, int64_t created, const std::string& model,
                             nlohmann::json delta, nlohmann::json finish_reason,
                             nlohmann::json usage, nlohmann::json logprobs = nullptr,
                             const std::string& service_tier = "");

}  // namespace hr::wire
