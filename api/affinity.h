// Cache-aware dispatch's keys: what a queued request's prompt starts with, as a 64-bit number
// stored with the request (requests.affinity). The relay sends requests with one key to one live
// worker (queue/affinity_routing.h), whose prefix cache then computes that start once. The key
// leaves the account out: the relay mixes it in, so that two accounts' equal prompts are placed
// independently (the engine's prefix cache is per account in any case).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "wire/chat_request.h"

namespace hr::api {

// Bytes of the first message that make the key of a request without system messages or tools.
inline constexpr size_t kAffinityPrefixBytes = 1024;

// The key of `r`'s start: its leading system and developer messages and its tools (what chat
// templates render first) when it has any, else the first kAffinityPrefixBytes of its first
// message (or of its prompt).
int64_t prefix_affinity(const wire::ChatRequest& r);
// The key of a submit's x-session-affinity header: every request of that submit gets it.
int64_t session_affinity(std::string_view session);

}  // namespace hr::api
