// Backoff with jitter and rate-limited warnings for failing loops (retry_pacer.h).
#include "base/retry_pacer.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "base/clock.h"
#include "base/log.h"

namespace hr {

RetryPacer::RetryPacer(RetryPacerOptions options)
    : options_(std::move(options)),
      rng_(options_.seed != 0 ? options_.seed : std::random_device{}()),
      ceiling_ms_(std::max<int64_t>(1, options_.first_ms)) {}

int64_t RetryPacer::now_ms() const {
  return options_.now_ms ? options_.now_ms() : steady_now_ns() / 1000000;
}

int64_t RetryPacer::failed(std::string_view event, const Status& error) {
  ++failures_;
  ++unlogged_;
  event_ = std::string(event);
  const int64_t ceiling = ceiling_ms_;
  const int64_t delay =
      std::uniform_int_distribution<int64_t>(std::max<int64_t>(1, ceiling / 2), ceiling)(rng_);
  ceiling_ms_ = std::min(options_.max_ms, ceiling * 2);
  const int64_t now = now_ms();
  if (last_logged_ms_ < 0 || now - last_logged_ms_ >= options_.log_every_ms) {
    log::warn(event, {{"error", error},
                      {"repeated", unlogged_},
                      {"failures", failures_},
                      {"retry_in_ms", delay}});
    unlogged_ = 0;
    last_logged_ms_ = now;
  }
  return delay;
}

void RetryPacer::succeeded() {
  if (failures_ > 0) {
    log::info(event_ + ".recovered", {{"failures", failures_}});
  }
  failures_ = 0;
  unlogged_ = 0;
  last_logged_ms_ = -1;
  ceiling_ms_ = std::max<int64_t>(1, options_.first_ms);
}

void sleep_unless_stopped(const std::atomic<bool>& stop, int64_t ms) {
  const int64_t end = steady_now_ns() + ms * 1000000;
  while (!stop.load()) {
    const int64_t left = end - steady_now_ns();
    if (left <= 0) return;
    std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<int64_t>(left, 100000000)));
  }
}

}  // namespace hr
