// How many entries a model's ready-queue (its Redis stream) should hold waiting for workers: enough
// for about `window_ms` of what the workers take, between `min_entries` and `max_entries`. A short
// queue is what makes the relay's fair share felt: a batch submitted now waits behind at most
// that much of others' work, while the workers never find the queue empty between two relays.
// The rate is learnt from the queue itself: what was waiting, plus what the relay pushed since,
// less what is waiting now, was taken. Pure; one per model in the dispatcher.
#pragma once

#include <cstdint>

namespace hr::queue {

struct RelayWindowOptions {
  int64_t min_entries = 256;
  int64_t max_entries = 20000;
  int64_t window_ms = 250;
};

class RelayWindow {
 public:
  explicit RelayWindow(RelayWindowOptions options) : options_(options) {}

  // The queue holds `waiting` entries not yet delivered at steady time `now_ns`; `pushed` entries
  // were added since the last call.
  void observe(int64_t now_ns, int64_t waiting, int64_t pushed);
  // The entries to keep waiting now.
  int64_t size() const;
  // The rate the workers took entries at, per second (smoothed).
  double rate_per_s() const { return rate_; }
  // The rate they take entries at while entries wait for them (the queue never ran dry, so they
  // took as fast as they could alongside their sync work), smoothed over about 10 s: the model's
  // throughput for work queued now. 0 until a second of such time has been seen.
  double saturated_rate_per_s() const { return saturated_rate_; }

 private:
  RelayWindowOptions options_;
  int64_t last_ns_ = 0;
  int64_t last_waiting_ = 0;
  int64_t taken_ = 0;      // since the last rate sample
  int64_t sample_ns_ = 0;  // when the current sample began
  double rate_ = 0;
  bool started_ = false;
  int64_t saturated_taken_ = 0;  // since the last saturated sample, over saturated_ns_
  int64_t saturated_ns_ = 0;
  double saturated_rate_ = 0;
};

}  // namespace hr::queue
