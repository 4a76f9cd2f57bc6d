// The sampling kernel's own source (and the launch-mode switch it launches through), built for the
// CPU stand-in for the CUDA runtime (include/cuda_runtime.h).
#include "kernels/launch.cu"
#include "kernels/sampling.cu"
