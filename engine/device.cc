// Device discovery, through kernels/ when CUDA is compiled in.
#include "engine/device.h"

#ifdef HEADROOM_HAVE_CUDA
#include "kernels/device.cuh"
#endif

namespace hr::engine {

bool cuda_compiled() {
#ifdef HEADROOM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::vector<GpuInfo> list_gpus() {
  std::vector<GpuInfo> out;
#ifdef HEADROOM_HAVE_CUDA
  int n = 0;
  if (kernels::device_count(&n) != cudaSuccess) return out;
  for (int i = 0; i < n; ++i) {
    kernels::DeviceInfo info;
    if (kernels::device_info(i, &info) != cudaSuccess) continue;
    out.push_back({i, info.name, info.compute_major, info.compute_minor, info.total_memory_bytes,
                   info.free_memory_bytes});
  }
#endif
  return out;
}

}  // namespace hr::engine
