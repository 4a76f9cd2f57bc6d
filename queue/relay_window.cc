// The ready-queue's size, from the rate workers take entries at.
#include "queue/relay_window.h"

#include <algorithm>
#include <cmath>

namespace hr::queue {

void RelayWindow::observe(int64_t now_ns, int64_t waiting, int64_t pushed) {
  if (!started_) {
    started_ = true;
    last_ns_ = sample_ns_ = now_ns;
    last_waiting_ = waiting;
    return;
  }
  const int64_t taken = std::max<int64_t>(0, last_waiting_ + pushed - waiting);
  taken_ += taken;
  // Saturated: entries waited at both ends of the interval.
  if (last_waiting_ > 0 && waiting > 0) {
    saturated_taken_ += taken;
    saturated_ns_ += now_ns - last_ns_;
    constexpr int64_t kSaturatedSampleNs = 1'000'000'000;
    if (saturated_ns_ >= kSaturatedSampleNs) {
      const double sample =
          static_cast<double>(saturated_taken_) * 1e9 / static_cast<double>(saturated_ns_);
      const double keep = std::exp(-static_cast<double>(saturated_ns_) / 10e9);
      saturated_rate_ =
          saturated_rate_ == 0 ? sample : keep * saturated_rate_ + (1 - keep) * sample;
      saturated_taken_ = 0;
      saturated_ns_ = 0;
    }
  }
  last_waiting_ = waiting;
  last_ns_ = now_ns;
  // A sample every 50 ms at least, smoothed over about the last half second; the rate rises at
  // once (the queue must not starve workers faster than it learns) and decays smoothly.
  constexpr int64_t kSampleNs = 50'000'000;
  const int64_t dt = now_ns - sample_ns_;
  if (dt < kSampleNs) return;
  const double sample = static_cast<double>(taken_) * 1e9 / static_cast<double>(dt);
  rate_ = sample > rate_ ? sample : rate_ + 0.1 * (sample - rate_);
  taken_ = 0;
  sample_ns_ = now_ns;
}

int64_t RelayWindow::size() const {
  const auto wanted = static_cast<int64_t>(rate_ * static_cast<double>(options_.window_ms) / 1000);
  return std::clamp(wanted, options_.min_entries,
                    std::max(options_.min_entries, options_.max_entries));
}

}  // namespace hr::queue
