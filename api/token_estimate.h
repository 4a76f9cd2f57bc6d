// A request's tokens before it runs: its prompt's bytes / 4 (rounded up) and its max_tokens. What
// a sync call is charged at admission against its account's tokens per minute, and what a queued
// request holds of its account's max_enqueued_tokens (docs/quotas.md).
#pragma once

#include <cstdint>

#include "wire/chat_request.h"

namespace hr::api {

int64_t estimate_call_tokens(int64_t prompt_bytes, int64_t max_tokens);
// Its prompt (or its messages' contents) and max_tokens.
int64_t estimate_request_tokens(const wire::ChatRequest& request);

}  // namespace hr::api
