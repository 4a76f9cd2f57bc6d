// SwiGLU's activation: out[t, i] = silu(gate_up[t, i]) * gate_up[t, F + i] (gate rows then up rows,
// as the fused gate/up GEMM writes them).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace hr::kernels {

// gate_up: [num_tokens, 2 * ffn] bf16; out: [num_tokens, ffn] bf16. ffn a multiple of 8 and the
// pointers 16-byte aligned take the vector path; other sizes work too.
cudaError_t silu_mul(const __nv_bfloat16* gate_up, int num_tokens, int ffn, __nv_bfloat16* out,
                     cudaStream_t stream);

}  // namespace hr::kernels
