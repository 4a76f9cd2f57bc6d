// Fills, grid-stride.
#include "kernels/fill.cuh"

#include <algorithm>

#include "kernels/internal/common.cuh"

namespace hr::kernels {
namespace {

// Element i of the uniform fill: in [-scale, scale), a pure function of (seed, i).
__device__ __forceinline__ float uniform_at(uint64_t seed, size_t i, float scale) {
  const uint64_t bits = internal::splitmix64(seed ^ internal::splitmix64(i));
  const float u = static_cast<float>(bits >> 40) * 0x1.0p-24f;  // [0, 1)
  return (2.0f * u - 1.0f) * scale;
}

__global__ void fill_uniform_bf16_kernel(__nv_bfloat16* out, size_t n, float scale, uint64_t seed) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(uniform_at(seed, i, scale));
  }
}

__global__ void fill_uniform_f32_kernel(float* out, size_t n, float scale, uint64_t seed) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = uniform_at(seed, i, scale);
  }
}

__global__ void fill_f32_kernel(float* out, size_t n, float value) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = value;
  }
}

}  // namespace

cudaError_t fill_uniform_bf16(__nv_bfloat16* out, size_t n, float scale, uint64_t seed,
                              cudaStream_t stream) {
  if (!out && n) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return internal::launch(fill_uniform_bf16_kernel, dim3(1024), dim3(256), 0, stream, out, n, scale,
                          seed);
}

cudaError_t fill_uniform_f32(float* out, size_t n, float scale, uint64_t seed,
                             cudaStream_t stream) {
  if (!out && n) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>(1024, (n + 255) / 256));
  return internal::launch(fill_uniform_f32_kernel, dim3(blocks), dim3(256), 0, stream, out, n,
                          scale, seed);
}

cudaError_t fill_f32(float* out, size_t n, float value, cudaStream_t stream) {
  if (!out && n) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  // As many blocks as the fill needs (a few floats take one), at most 1024.
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>(1024, (n + 255) / 256));
  return internal::launch(fill_f32_kernel, dim3(blocks), dim3(256), 0, stream, out, n, value);
}

}  // namespace hr::kernels
