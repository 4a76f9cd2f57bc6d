// How a loop that talks to Postgres, Redis or a webhook target paces itself while they fail:
// exponential backoff with jitter (the first delay `first_ms`, doubling up to `max_ms`, each drawn
// uniformly from its upper half so that many workers do not retry in step), and its warnings
// rate-limited: the first failure is logged at once, later ones at most once per `log_every_ms`
// as one line counting them ("repeated"), and a success after failures says how many there were.
//   RetryPacer pacer;
//   if (!st.is_ok()) sleep_ms(pacer.failed("worker.complete_failed", st)); else pacer.succeeded();
// Not thread-safe: one per loop.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <string_view>

#include "base/status.h"

namespace hr {

struct RetryPacerOptions {
  int64_t first_ms = 100;
  int64_t max_ms = 5000;
  int64_t log_every_ms = 10000;
  std::function<int64_t()> now_ms;  // default: a steady clock
  uint32_t seed = 0;                // 0: a random seed
};

class RetryPacer {
 public:
  explicit RetryPacer(RetryPacerOptions options = {});

  // After a failure: logs `event` (with the error, how many failures the line stands for, and
  // the delay) when a line is due, and returns the delay before the next try, in milliseconds.
  int64_t failed(std::string_view event, const Status& error);
  // After a success: the delay starts over; after failures, one line `<event>.recovered` of the
  // last failure's event with their count.
  void succeeded();

  int64_t consecutive_failures() const { return failures_; }
  // The delay the next failure would start from (before jitter): for tests and metrics.
  int64_t current_ceiling_ms() const { return ceiling_ms_; }

 private:
  int64_t now_ms() const;

  RetryPacerOptions options_;
  std::minstd_rand rng_;
  int64_t ceiling_ms_;
  int64_t failures_ = 0;
  int64_t unlogged_ = 0;         // failures since the last line
  int64_t last_logged_ms_ = -1;  // -1: none logged in this run of failures
  std::string event_;
};

// Sleeps `ms` in slices of at most 100 ms, returning early once `stop` is set: a loop's backoff
// must not hold up its shutdown.
void sleep_unless_stopped(const std::atomic<bool>& stop, int64_t ms);

}  // namespace hr
