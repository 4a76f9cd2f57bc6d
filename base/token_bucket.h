// A token bucket: `rate` tokens a second accrue up to `burst`; take() spends one when there is
// one. Thread-safe. Used to bound work that callers can cause without any credential (the API's
// database lookups of keys it has not seen).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>

namespace hr {

class TokenBucket {
 public:
  // `now_ns`: a steady clock in nanoseconds (default: base/clock.h's steady_now_ns).
  TokenBucket(double rate_per_s, double burst, std::function<int64_t()> now_ns = {});
  bool take();
  // Whether take() would succeed now, spending nothing; and spending one after the fact (down
  // to none): for charging only what turned out to cost (a key that was not known).
  bool has_token();
  void spend();

 private:
  void refill();  // mu_ held

  const double rate_per_ns_;
  const double burst_;
  std::function<int64_t()> now_ns_;
  std::mutex mu_;
  double tokens_;    // guarded by mu_
  int64_t last_ns_;  // guarded by mu_
};

}  // namespace hr
