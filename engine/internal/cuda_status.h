// CUDA errors as Status for the CUDA backend's sources (internal to engine/): the op, the device
// and CUDA's own name and text for the error.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "base/status.h"

namespace hr::engine::internal {

inline Status cuda_error(const std::string& op, cudaError_t err, int device) {
  return internal_error(op + " failed on cuda:" + std::to_string(device) + ": " +
                        cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace hr::engine::internal

// Returns the Status for a failed CUDA call from a CudaBackend member (HR_CUDA) or from code
// holding a CudaBackend pointer (HR_CUDA_OF).
#define HR_CUDA_OF(backend, op, expr)                                                          \
  do {                                                                                         \
    cudaError_t hr_cuda_err_ = (expr);                                                         \
    if (hr_cuda_err_ != cudaSuccess) {                                                         \
      return ::hr::engine::internal::cuda_error(op, hr_cuda_err_, (backend)->options_.device); \
    }                                                                                          \
  } while (0)
#define HR_CUDA(op, expr) HR_CUDA_OF(this, op, expr)
