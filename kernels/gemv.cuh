// Matrix-vector products for decode steps with few rows: y[m, n] = x[m, k] · w[n, k]^T for
// m <= kGemvMaxRows, bound by reading w once at full memory bandwidth (cuBLASLt handles larger m).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace hr::kernels {

constexpr int kGemvMaxRows = 8;

// x: [m, k] bf16; w: [n, k] bf16; y: [m, n], fp32 when y_bf16 is false, else bf16. k a multiple
// of 8 and x, w 16-byte aligned.
cudaError_t gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool y_bf16, int m, int n, int k,
                 cudaStream_t stream);

}  // namespace hr::kernels
