// Device-side fills: uniform random bf16 from a counter-based hash (weights for benchmarks made on
// the GPU, no host copy), and fp32 constants.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace hr::kernels {

// out[i] = bf16(uniform in [-scale, scale)), a pure function of (seed, i).
cudaError_t fill_uniform_bf16(__nv_bfloat16* out, size_t n, float scale, uint64_t seed,
                              cudaStream_t stream);
// The same uniform values in fp32.
cudaError_t fill_uniform_f32(float* out, size_t n, float scale, uint64_t seed, cudaStream_t stream);
cudaError_t fill_f32(float* out, size_t n, float value, cudaStream_t stream);

}  // namespace hr::kernels
