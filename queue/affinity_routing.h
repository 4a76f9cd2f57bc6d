// Cache-aware dispatch: the stream each request the relay pushes goes to. A request with an
// affinity key (api/affinity.h, mixed with its account) goes to the live worker that rendezvous
// hashing ranks first for the key, unless that worker's own stream already holds `cap` entries
// waiting; then to the next-ranked worker with room. So one key stays on one worker while it
// lives and the load allows, a key too popular for one worker spreads over a few (each computes
// its prefix once), and a departed worker's keys move to their next-ranked workers alone. With
// no worker with room, or no key, the request goes to the shared stream (any worker).
// Plain computation, no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hr::queue {

inline constexpr int kSharedStream = -1;

// The key a request is placed by: its account's and its stored affinity's, so that equal prompts
// of two accounts are placed independently.
uint64_t routing_key(std::string_view account_id, int64_t affinity);

// For each request (keys[i]; none: no affinity), the index in `workers` (live, sorted ids) of the
// worker whose stream it goes to, or kSharedStream. `waiting[w]` holds the entries waiting in
// worker w's stream and grows with each request placed there; a worker takes at most `cap`.
std::vector<int> route_by_affinity(const std::vector<std::optional<uint64_t>>& keys,
                                   const std::vector<std::string>& workers,
                                   std::vector<int64_t>* waiting, int64_t cap);

// The most entries one worker's stream may hold waiting: a fair part of the relay's `window` over
// `num_workers`, with a quarter more so that uneven keys still find room on their first worker.
int64_t worker_stream_cap(int64_t window, int num_workers);

}  // namespace hr::queue
