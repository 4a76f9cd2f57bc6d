// The launch-mode switch.
#include <cuda_runtime.h>

#include <atomic>

#include "kernels/launch.cuh"

namespace hr::kernels {
namespace {

thread_local bool t_programmatic = true;

__global__ void probe_kernel() {}

}  // namespace

bool programmatic_launch_supported() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices];  // 0: not asked yet, 1: yes, 2: no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (device >= 0 && device < kMaxDevices) {
    if (int k = known[device].load(std::memory_order_relaxed); k != 0) return k == 1;
  }
  cudaFuncAttributes a{};
  const bool yes = cudaFuncGetAttributes(&a, probe_kernel) == cudaSuccess && a.ptxVersion >= 90;
  if (device >= 0 && device < kMaxDevices)
    known[device].store(yes ? 1 : 2, std::memory_order_relaxed);
  return yes;
}

void set_programmatic_launch(bool on) { t_programmatic = on; }
bool programmatic_launch() { return t_programmatic && programmatic_launch_supported(); }

}  // namespace hr::kernels
