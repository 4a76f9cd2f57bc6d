// The headroom policy: how many queued (async) requests a worker may pull now, its credits. Sync
// traffic comes first, so the worker pulls only into the room that sync requests leave:
//   - nothing while any request waits in the engine (sync or async), while the worker stops or
//     drains, or while the last step used its whole token budget (new work would only wait);
//   - otherwise the free sequence slots less a reserve kept for sync bursts (the configured
//     reserve, or as many more sync sequences as the recent peak had, up to half the slots), at
//     most max_pull at once;
//   - and no more than the free KV blocks, less the reserve's, hold at the KV size of a request
//     (its prompt and max_tokens, as learned from the requests pulled so far: RequestSizes);
//   - less the credits already granted whose requests are still on their way;
//   - and none while the utilization brake is engaged.
// A pure function of what the step loop knows, so that each case is a unit test.
#pragma once

#include <cstdint>

#include "engine/scheduler.h"

namespace hr::workers {

struct HeadroomPolicyConfig {
  int max_num_seqs = 32;  // sequences the engine runs at once
  int reserve_slots = 2;  // sequence slots always kept free for sync bursts
  int max_pull = 64;      // most requests taken from the queue at once
};

// What the step loop knows when it grants credits.
struct PolicyState {
  engine::Headroom headroom;     // as the engine reports it now
  int sync_peak = 0;             // most sync sequences at once over the last seconds
  int blocks_per_request = 1;    // KV blocks a queued request takes (RequestSizes)
  int in_transit = 0;            // credits granted, their requests not yet arrived
  bool engine_has_work = false;  // the next step has something to run
  bool stopping = false;         // stopping or draining: no new work
  bool brake_engaged = false;    // the utilization brake (UtilizationBrake::engaged)
  int catch_up_held = 0;         // catch-up requests in the engine (running or waiting)
  int catch_up_in_transit = 0;   // catch-up requests pulled, not yet arrived
};

// The last rule that lowered the credits (kSlots when none but the slots did).
enum class CreditLimit {
  kStopping,     // stopping or draining
  kWaiting,      // requests wait in the engine
  kTokenBudget,  // the last step used its whole token budget
  kSlots,        // free sequence slots less the reserve
  kMaxPull,      // max_pull
  kKvBlocks,     // free KV blocks less the reserve's
  kInTransit,    // credits already on their way
  kBrake,        // the utilization brake
};
const char* credit_limit_name(CreditLimit limit);

struct Credits {
  int granted = 0;  // requests to pull now (never negative)
  int reserve = 0;  // sequence slots kept for sync
  CreditLimit limit = CreditLimit::kSlots;
};

Credits grant_credits(const PolicyState& state, const HeadroomPolicyConfig& config);

// Catch-up requests (queue/stream.h) to pull now, headroom or not: they start at once by
// preempting the other queued work running. The slots less the sync reserve and the sync
// sequences, less the catch-up requests held or on their way, at most max_pull; none while
// stopping. (The utilization brake does not apply: they take the place of work already running.)
int catch_up_credits(const PolicyState& state, const HeadroomPolicyConfig& config);

// The KV blocks a queued request takes: its prompt and its max_tokens, averaged (exponentially,
// over about the last 16) over the requests pulled so far, in blocks of `block_size` tokens.
// Until one is seen, a short prompt with the default 256-token answer. Step loop only.
class RequestSizes {
 public:
  static constexpr int kPriorTokens = 256;
  explicit RequestSizes(int block_size) : block_size_(block_size > 0 ? block_size : 16) {}
  void record(int prompt_tokens, int max_tokens);
  int blocks_per_request() const;

 private:
  int block_size_;
  double mean_tokens_ = kPriorTokens;
  int64_t seen_ = 0;
};

}  // namespace hr::workers
