// The utilization brake.
#include "workers/utilization.h"

#include <algorithm>
#include <cmath>

namespace hr::workers {

namespace {
constexpr double kWindowNs = 1e9;               // smoothing time constant
constexpr int64_t kGpuReadEveryNs = 200000000;  // NVML samples about every 1/6 s
}  // namespace

UtilizationBrake::UtilizationBrake(double max_utilization, std::unique_ptr<engine::GpuMonitor> gpu,
                                   int device)
    : max_(max_utilization), gpu_(std::move(gpu)), device_(device) {}

UtilizationBrake::~UtilizationBrake() = default;

void UtilizationBrake::record(int64_t busy_ns, int64_t loop_ns, int64_t now_ns) {
  if (loop_ns > 0) {
    double sample =
        std::clamp(static_cast<double>(busy_ns) / static_cast<double>(loop_ns), 0.0, 1.0);
    double keep = std::exp(-static_cast<double>(loop_ns) / kWindowNs);
    busy_ = keep * busy_ + (1 - keep) * sample;
  }
  if (gpu_ && now_ns >= next_gpu_read_ns_) {
    next_gpu_read_ns_ = now_ns + kGpuReadEveryNs;
    auto r = gpu_->read(device_);
    if (r.is_ok()) gpu_util_ = r->utilization_percent / 100.0;
  }
  utilization_ = std::max(busy_, gpu_util_);
}

void RecentPeak::record(int value, int64_t now_ns) {
  int64_t second = now_ns / 1000000000;
  const int64_t n = static_cast<int64_t>(max_.size());
  if (second != second_) {
    // Clear the seconds that passed without a record (all of them after a long gap).
    int64_t from = second_ < 0 ? second - n + 1 : std::max(second_ + 1, second - n + 1);
    for (int64_t s = from; s <= second; ++s) max_[static_cast<size_t>(s % n)] = 0;
    second_ = second;
  }
  int& slot = max_[static_cast<size_t>(second % n)];
  slot = std::max(slot, value);
}

int RecentPeak::peak() const {
  int p = 0;
  for (int v : max_) p = std::max(p, v);
  return p;
}

void StepCost::record(int64_t step_ns, int tokens) {
  if (tokens < kMinTokens || step_ns <= 0) return;
  double v = static_cast<double>(step_ns) / tokens;
  ns_per_token_ = ns_per_token_ > 0 ? 0.9 * ns_per_token_ + 0.1 * v : v;
}

int StepCost::tokens_within(double ms) const {
  if (ns_per_token_ <= 0) return 0;
  return std::max(kMinTokens, static_cast<int>(ms * 1e6 / ns_per_token_));
}

}  // namespace hr::workers
