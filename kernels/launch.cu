// The launch-mode switch.
#include <cuda_runtime.h>

#include "kernels/internal/common.cuh"
#include "kernels/launch.cuh"

namespace hr::kernels {
namespace {

thread_local bool t_programmatic = true;

__global__ void probe_kernel() {}

}  // namespace

bool programmatic_launch_supported() {
  return internal::once_per_device([](int) {
    cudaFuncAttributes a{};
    return cudaFuncGetAttributes(&a, probe_kernel) == cudaSuccess && a.ptxVersion >= 90;
  });
}

void set_programmatic_launch(bool on) { t_programmatic = on; }
bool programmatic_launch() { return t_programmatic && programmatic_launch_supported(); }

}  // namespace hr::kernels
