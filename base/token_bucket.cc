// A token bucket (token_bucket.h).
#include "base/token_bucket.h"

#include <algorithm>

#include "base/clock.h"

namespace hr {

TokenBucket::TokenBucket(double rate_per_s, double burst, std::function<int64_t()> now_ns)
    : rate_per_ns_(rate_per_s / 1e9),
      burst_(burst),
      now_ns_(now_ns ? std::move(now_ns) : [] { return steady_now_ns(); }),
      tokens_(burst),
      last_ns_(now_ns_()) {}

void TokenBucket::refill() {
  const int64_t now = now_ns_();
  tokens_ = std::min(burst_, tokens_ + static_cast<double>(now - last_ns_) * rate_per_ns_);
  last_ns_ = now;
}

bool TokenBucket::take() {
  std::lock_guard<std::mutex> lock(mu_);
  refill();
  if (tokens_ < 1.0) return false;
  tokens_ -= 1.0;
  return true;
}

bool TokenBucket::has_token() {
  std::lock_guard<std::mutex> lock(mu_);
  refill();
  return tokens_ >= 1.0;
}

void TokenBucket::spend() {
  std::lock_guard<std::mutex> lock(mu_);
  refill();
  tokens_ = std::max(0.0, tokens_ - 1.0);
}

}  // namespace hr
