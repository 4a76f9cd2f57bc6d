// Which compute devices this build can use: the CPU always, CUDA devices when the CUDA backend was
// compiled in and a driver and device are present. Thread-safe.
#pragma once

#include <string>
#include <vector>

namespace hr::engine {

struct GpuInfo {
  int index = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  size_t total_memory_bytes = 0;
  size_t free_memory_bytes = 0;
};

// True when the CUDA backend is part of this build.
bool cuda_compiled();
// The visible CUDA devices; empty without CUDA, a driver or a device.
std::vector<GpuInfo> list_gpus();

}  // namespace hr::engine
