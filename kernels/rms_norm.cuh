// RMSNorm fused with the residual add: x[r] += delta[r]; out[i] = bf16(x[r] / rms(x[r]) * weight),
// for r = rows[i] (or i when rows is null). The residual stream x stays fp32. With delta_rows = k,
// delta holds k rows per row of x (a MoE layer's weighted expert outputs), added in order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace hr::kernels {

struct AddRmsNormParams {
  float* x = nullptr;            // [*, dim] residual stream, updated in place
  const float* delta = nullptr;  // [*, delta_rows, dim] added to x first; null: no add
  int delta_rows = 1;
  const float* weight = nullptr;  // [dim]
  const int32_t* rows = nullptr;  // [num_rows] rows of x to normalise; null: rows 0..num_rows-1
  __nv_bfloat16* out = nullptr;   // [num_rows, dim]
  int num_rows = 0;
  int dim = 0;
  float eps = 1e-5f;
};

// When rows is given, the add happens only for the listed rows. With weight and out both null,
// only the add: x[r] += delta[r] (a pipeline stage's last residual add, which the next stage's
// first norm does not take).
cudaError_t add_rms_norm(const AddRmsNormParams& p, cudaStream_t stream);

}  // namespace hr::kernels
