// GPU utilisation and memory readings from NVML, loaded at run time with dlopen (no link-time
// dependency: machines without the NVIDIA driver simply have no monitor). The worker's secondary
// brake on pulling async work reads it (workers/utilization.h). Thread-safe after open().
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "base/status.h"

namespace hr::engine {

struct GpuReading {
  int utilization_percent = 0;         // time a kernel was running over the last sample period
  int memory_utilization_percent = 0;  // time device memory was being read or written
  size_t memory_used_bytes = 0;
  size_t memory_total_bytes = 0;
};

class GpuMonitor {
 public:
  // Loads libnvidia-ml and initialises it; an error (unavailable) when there is no driver.
  [[nodiscard]] static Result<std::unique_ptr<GpuMonitor>> open();
  ~GpuMonitor();
  int num_devices() const { return num_devices_; }
  // The reading of device `index` (NVML's numbering).
  [[nodiscard]] Result<GpuReading> read(int index) const;

 private:
  struct Api;
  GpuMonitor() = default;
  void* lib_ = nullptr;
  std::unique_ptr<Api> api_;
  int num_devices_ = 0;
};

}  // namespace hr::engine
