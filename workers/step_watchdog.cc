// The step watchdog's thread: a look at the step in progress a few times per limit.
#include "workers/step_watchdog.h"

#include <algorithm>
#include <chrono>

#include "base/clock.h"

namespace hr::workers {

StepWatchdog::StepWatchdog(int64_t limit_ns, std::function<void(int64_t)> on_stuck)
    : limit_ns_(limit_ns), on_stuck_(std::move(on_stuck)) {
  if (limit_ns_ > 0) thread_ = std::thread([this] { loop(); });
}

StepWatchdog::~StepWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StepWatchdog::begin_step() { step_start_ns_ = steady_now_ns(); }

bool StepWatchdog::end_step() { return step_start_ns_.exchange(0) == kClaimed; }

void StepWatchdog::loop() {
  // A stuck step is seen within a quarter of the limit (at most a second) of passing it.
  const int64_t look_ns = std::clamp<int64_t>(limit_ns_ / 4, 10'000'000, 1'000'000'000);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::nanoseconds(look_ns), [&] { return stop_; });
    if (stop_) return;
    int64_t start = step_start_ns_.load();
    if (start <= 0) continue;
    const int64_t ran = steady_now_ns() - start;
    if (ran <= limit_ns_) continue;
    // Claimed, unless the step ended (or another began) meanwhile: the step loop then knows.
    if (!step_start_ns_.compare_exchange_strong(start, kClaimed)) continue;
    lock.unlock();
    on_stuck_(ran);
    return;  // once: a stuck engine is not trusted again
  }
}

}  // namespace hr::workers
