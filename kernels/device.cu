// CUDA device discovery.
#include "kernels/device.cuh"

#include <cstring>

namespace hr::kernels {

cudaError_t device_count(int* count) {
  *count = 0;
  cudaError_t err = cudaGetDeviceCount(count);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    cudaGetLastError();  // clear the sticky-free error state
    *count = 0;
    return cudaSuccess;
  }
  return err;
}

cudaError_t device_info(int device, DeviceInfo* info) {
  cudaDeviceProp prop;
  cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) return err;
  std::memset(info->name, 0, sizeof info->name);
  std::strncpy(info->name, prop.name, sizeof info->name - 1);
  info->compute_major = prop.major;
  info->compute_minor = prop.minor;
  // The memory reading needs the device current: the caller's current device is restored after.
  int current = 0;
  err = cudaGetDevice(&current);
  if (err != cudaSuccess) return err;
  err = cudaSetDevice(device);
  if (err != cudaSuccess) return err;
  err = cudaMemGetInfo(&info->free_memory_bytes, &info->total_memory_bytes);
  cudaError_t restored = cudaSetDevice(current);
  return err != cudaSuccess ? err : restored;
}

}  // namespace hr::kernels
