// From the native chat request to the engine's: the model's chat template renders the messages,
// the tokenizer encodes them, and the sampling fields become the engine's parameters (the worker's
// defaults where the client set none). Also the engine's events as the answer's log probabilities.
#pragma once

#include <optional>

#include "base/status.h"
#include "engine/engine.h"
#include "engine/tool_calls.h"
#include "wire/answer.h"
#include "wire/chat_request.h"
#include "workers/loaded_model.h"

namespace hr::workers {

// kInvalidArgument naming the field for what the model cannot take (a logit_bias token past its
// vocabulary, a message its template refuses).
[[nodiscard]] Result<engine::GenerationRequest> to_generation(const wire::ChatRequest& request,
                                                              const LoadedModel& model,
                                                              engine::RequestClass cls);

// The format the model writes tool calls in when the request offers it tools (tool_choice auto),
// else kNone: the answer is then read for calls (extract_tool_calls).
engine::ToolCallFormat offered_tool_calls(const wire::ChatRequest& request,
                                          const LoadedModel& model);

// A new tool call id ("call_" and 24 hex digits).
std::string new_call_id();

// Moves the calls in `answer`'s text into its tool_calls (each with a new id), leaving the rest of
// the text; finish_reason becomes tool_calls when there were any.
void extract_tool_calls(engine::ToolCallFormat format, wire::Answer* answer);

// The event's token with its log probability and alternatives; none for an event without log
// probabilities (a cancelled or failed end).
std::optional<wire::TokenLogprob> token_logprob(TokenBytes& bytes, const engine::TokenEvent& ev);

}  // namespace hr::workers
