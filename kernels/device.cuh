// CUDA device discovery for the engine and the worker: how many devices are usable, and their
// names and memory. Launchers take raw pointers and return cudaError_t (house style for kernels/).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace hr::kernels {

// Number of visible CUDA devices; 0 (and cudaSuccess) when there is no driver or no device.
cudaError_t device_count(int* count);

struct DeviceInfo {
  char name[256];
  int compute_major;
  int compute_minor;
  size_t total_memory_bytes;
  size_t free_memory_bytes;
};

cudaError_t device_info(int device, DeviceInfo* info);

}  // namespace hr::kernels
