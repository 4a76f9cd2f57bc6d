// The launch-mode switch.
#include <cuda_runtime.h>

#include "kernels/launch.cuh"

namespace hr::kernels {
namespace {

thread_local bool t_programmatic = true;
thread_local int t_waits_compiled = -1;  // unknown yet on this thread

__global__ void probe_kernel() {}

// Whether the code the current device runs was built for sm_90 or later, where every kernel's
// griddepcontrol.wait is compiled in. A newer GPU may run the compute_80 PTX instead (JIT), whose
// kernels do not wait: there, programmatic launch would let a kernel read its predecessor's
// output too early.
bool waits_compiled_in() {
  if (t_waits_compiled < 0) {
    cudaFuncAttributes a{};
    t_waits_compiled = cudaFuncGetAttributes(&a, probe_kernel) == cudaSuccess && a.ptxVersion >= 90;
  }
  return t_waits_compiled == 1;
}

}  // namespace

void set_programmatic_launch(bool on) { t_programmatic = on; }
bool programmatic_launch() { return t_programmatic && waits_compiled_in(); }

}  // namespace hr::kernels
