// From the native chat request to the engine's: the model's chat template renders the messages,
// the tokenizer encodes them, and the sampling fields become the engine's parameters (the worker's
// defaults where the client set none). Also the engine's events as the answer's log probabilities.
#pragma once

#include <optional>

#include "base/status.h"
#include "engine/engine.h"
#include "wire/answer.h"
#include "wire/chat_request.h"
#include "workers/loaded_model.h"

namespace hr::workers {

// kInvalidArgument naming the field for what the model cannot take (a logit_bias token past its
// vocabulary, a message its template refuses).
[[nodiscard]] Result<engine::GenerationRequest> to_generation(const wire::ChatRequest& request,
                                                              const LoadedModel& model,
                                                              engine::RequestClass cls);

// The event's token with its log probability and alternatives; none for an event without log
// probabilities (a cancelled or failed end).
std::optional<wire::TokenLogprob> token_logprob(TokenBytes& bytes, const engine::TokenEvent& ev);

}  // namespace hr::workers
