// The utilization brake.
#include "workers/utilization.h"

#include <algorithm>
#include <cmath>

namespace hr::workers {

namespace {
constexpr double kWindowNs = 1e9;            // smoothing time constant
constexpr int64_t kGpuReadEveryNs = 200000000;  // NVML samples about every 1/6 s
}  // namespace

UtilizationBrake::UtilizationBrake(double max_utilization, std::unique_ptr<engine::GpuMonitor> gpu,
                                   int device)
    : max_(max_utilization), gpu_(std::move(gpu)), device_(device) {}

UtilizationBrake::~UtilizationBrake() = default;

void UtilizationBrake::record(int64_t busy_ns, int64_t loop_ns, int64_t now_ns) {
  if (loop_ns > 0) {
    double sample = std::clamp(static_cast<double>(busy_ns) / static_cast<double>(loop_ns), 0.0, 1.0);
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

}  // namespace hr::workers
