// Watches a worker's step loop from a thread of its own (docs/parallel-engine.md "When a rank
// stops"): a step that has run longer than the limit means the engine is stuck (a rank waiting
// in a collective for a peer that never comes, a wedged device), and nothing on the step loop's
// thread can notice it. Then `on_stuck` runs, once, on the watchdog's thread, with how long the
// step has run. The limit is far above any step's time (a step is bounded by its token budget).
// begin_step()/end_step() from the step loop only; the rest from the owner's thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace hr::workers {

class StepWatchdog {
 public:
  // `limit_ns` 0: no watching (no thread).
  StepWatchdog(int64_t limit_ns, std::function<void(int64_t step_ns)> on_stuck);
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;

  void begin_step();
  // True when the watchdog took this step as stuck (on_stuck runs, or ran, for it): the step
  // loop ends, whenever the step came back.
  bool end_step();

 private:
  void loop();

  const int64_t limit_ns_;
  std::function<void(int64_t)> on_stuck_;
  // When the step under way began; 0: none; kClaimed: taken as stuck.
  static constexpr int64_t kClaimed = -1;
  std::atomic<int64_t> step_start_ns_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace hr::workers
