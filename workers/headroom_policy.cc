// The headroom policy.
#include "workers/headroom_policy.h"

#include <algorithm>
#include <cmath>

namespace hr::workers {

const char* credit_limit_name(CreditLimit limit) {
  switch (limit) {
    case CreditLimit::kStopping:
      return "stopping";
    case CreditLimit::kWaiting:
      return "waiting";
    case CreditLimit::kTokenBudget:
      return "token_budget";
    case CreditLimit::kSlots:
      return "slots";
    case CreditLimit::kMaxPull:
      return "max_pull";
    case CreditLimit::kKvBlocks:
      return "kv_blocks";
    case CreditLimit::kInTransit:
      return "in_transit";
    case CreditLimit::kBrake:
      return "brake";
  }
  return "unknown";
}

namespace {

// Room kept for sync: the configured reserve, or as many more sync sequences as the recent peak
// had (up to half the slots: a past burst must not shut async work out).
int sync_reserve(const PolicyState& s, const HeadroomPolicyConfig& config) {
  const int sync_now = s.headroom.running_sync + s.headroom.waiting_sync;
  return std::max(config.reserve_slots, std::min(s.sync_peak - sync_now, config.max_num_seqs / 2));
}

}  // namespace

Credits grant_credits(const PolicyState& s, const HeadroomPolicyConfig& config) {
  const engine::Headroom& h = s.headroom;
  Credits c;
  c.reserve = sync_reserve(s, config);
  if (s.stopping) {
    c.limit = CreditLimit::kStopping;
    return c;
  }
  if (h.waiting_sync > 0 || h.waiting_async > 0) {
    c.limit = CreditLimit::kWaiting;
    return c;
  }
  if (s.engine_has_work && h.token_budget_left <= 0) {
    c.limit = CreditLimit::kTokenBudget;
    return c;
  }
  int credits = h.free_seq_slots - c.reserve;
  c.limit = CreditLimit::kSlots;
  if (config.max_pull < credits) {
    credits = config.max_pull;
    c.limit = CreditLimit::kMaxPull;
  }
  const int per_request = std::max(1, s.blocks_per_request);
  const int by_kv = (h.free_kv_blocks - c.reserve * per_request) / per_request;
  if (by_kv < credits) {
    credits = by_kv;
    c.limit = CreditLimit::kKvBlocks;
  }
  if (s.in_transit > 0 && credits > 0) {
    credits -= s.in_transit;
    c.limit = CreditLimit::kInTransit;
  }
  if (credits > 0 && s.brake_engaged) {
    credits = 0;
    c.limit = CreditLimit::kBrake;
  }
  c.granted = std::max(credits, 0);
  return c;
}

int catch_up_credits(const PolicyState& s, const HeadroomPolicyConfig& config) {
  if (s.stopping) return 0;
  const int sync_now = s.headroom.running_sync + s.headroom.waiting_sync;
  const int room = config.max_num_seqs - sync_reserve(s, config) - sync_now - s.catch_up_held -
                   s.catch_up_in_transit;
  return std::clamp(room, 0, config.max_pull);
}

void RequestSizes::record(int prompt_tokens, int max_tokens) {
  const double tokens = std::max(0, prompt_tokens) + std::max(0, max_tokens);
  ++seen_;
  // The first requests replace the prior; later ones move the mean by 1/16 each.
  const double weight = seen_ < 16 ? 1.0 / static_cast<double>(seen_) : 1.0 / 16;
  mean_tokens_ += weight * (tokens - mean_tokens_);
}

int RequestSizes::blocks_per_request() const {
  return std::max(1, static_cast<int>(std::ceil(mean_tokens_ / block_size_)));
}

}  // namespace hr::workers
