// SiLU-and-multiply, 16-byte vectors where the shape allows.
#include "kernels/internal/common.cuh"
#include "kernels/silu_mul.cuh"

namespace hr::kernels {
namespace {

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

__global__ void silu_mul_vec_kernel(const __nv_bfloat16* gate_up, int ffn, __nv_bfloat16* out) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  const int t = blockIdx.y;
  const int v = blockIdx.x * blockDim.x + threadIdx.x;  // vector index within the row
  if (v >= ffn / 8) return;
  const __nv_bfloat16* row = gate_up + static_cast<size_t>(t) * 2 * ffn;
  float g[8], u[8], o[8];
  internal::bf16x8_to_float(reinterpret_cast<const uint4*>(row)[v], g);
  internal::bf16x8_to_float(reinterpret_cast<const uint4*>(row + ffn)[v], u);
#pragma unroll
  for (int i = 0; i < 8; ++i) o[i] = silu(g[i]) * u[i];
  reinterpret_cast<uint4*>(out + static_cast<size_t>(t) * ffn)[v] = internal::float_to_bf16x8(o);
}

__global__ void silu_mul_kernel(const __nv_bfloat16* gate_up, int ffn, __nv_bfloat16* out) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  const int t = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= ffn) return;
  const __nv_bfloat16* row = gate_up + static_cast<size_t>(t) * 2 * ffn;
  float g = __bfloat162float(row[i]);
  float u = __bfloat162float(row[ffn + i]);
  out[static_cast<size_t>(t) * ffn + i] = __float2bfloat16_rn(silu(g) * u);
}

}  // namespace

cudaError_t silu_mul(const __nv_bfloat16* gate_up, int num_tokens, int ffn, __nv_bfloat16* out,
                     cudaStream_t stream) {
  if (num_tokens < 0 || ffn <= 0 || num_tokens > 65535) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  const int threads = 256;
  if (ffn % 8 == 0 && internal::aligned16(gate_up) && internal::aligned16(out)) {
    dim3 grid((ffn / 8 + threads - 1) / threads, num_tokens);
    return internal::launch(silu_mul_vec_kernel, grid, dim3(threads), 0, stream, gate_up, ffn, out);
  } else {
    dim3 grid((ffn + threads - 1) / threads, num_tokens);
    return internal::launch(silu_mul_kernel, grid, dim3(threads), 0, stream, gate_up, ffn, out);
  }
}

}  // namespace hr::kernels
