// The worker's secondary brake on pulling async work: how busy the device is, as the larger of
// the engine's own busy fraction (time spent in engine steps, smoothed over about a second) and,
// on a GPU, NVML's utilization of that device (which also counts other processes). Above
// --max-utilization the worker pulls nothing new; running work continues. At 1 (the default) the
// brake never engages: the primary limits (free slots, KV blocks, waiting sync requests) apply.
// Used by the worker's step loop only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/gpu_monitor.h"

namespace hr::workers {

class UtilizationBrake {
 public:
  // `gpu` may be null (CPU backend, or no driver); `device` is its NVML index.
  UtilizationBrake(double max_utilization, std::unique_ptr<engine::GpuMonitor> gpu, int device);
  ~UtilizationBrake();

  // One pass of the step loop took `loop_ns`, of which `busy_ns` in engine steps.
  void record(int64_t busy_ns, int64_t loop_ns, int64_t now_ns);
  // The current estimate, 0..1.
  double utilization() const { return utilization_; }
  bool engaged() const { return max_ < 1.0 && utilization_ > max_; }

 private:
  double max_;
  std::unique_ptr<engine::GpuMonitor> gpu_;
  int device_;
  double busy_ = 0;      // smoothed own busy fraction
  double gpu_util_ = 0;  // last NVML reading
  int64_t next_gpu_read_ns_ = 0;
  double utilization_ = 0;
};

// The largest value recorded in the last `window_s` seconds (per-second maxima in a ring). The
// worker keeps room for as many sync sequences as it recently had at once, so a sync burst like the
// last one finds free slots instead of preempting async sequences (whose work is then redone).
class RecentPeak {
 public:
  explicit RecentPeak(int window_s = 10) : max_(static_cast<size_t>(window_s), 0) {}
  void record(int value, int64_t now_ns);
  int peak() const;

 private:
  std::vector<int> max_;  // max_[second % size]
  int64_t second_ = -1;   // the second max_ was last written for
};

// The engine's time per token in a step, learned from the steps it runs: a moving average over
// steps of at least kMinTokens tokens (smaller ones are all fixed cost), of step time / tokens (an
// overestimate by the fixed cost / tokens, so caps sized from it err short).
class StepCost {
 public:
  static constexpr int kMinTokens = 16;
  void record(int64_t step_ns, int tokens);
  // Tokens a step may hold to last about `ms`; 0 while nothing is known yet.
  int tokens_within(double ms) const;

 private:
  double ns_per_token_ = 0;  // 0: no step recorded yet
};

}  // namespace hr::workers
