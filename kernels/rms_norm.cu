// Fused residual add + RMSNorm: one block per row (about four columns a thread), fp32 sums.
#include <algorithm>

#include "kernels/internal/common.cuh"
#include "kernels/rms_norm.cuh"

namespace hr::kernels {
namespace {

__global__ void add_rms_norm_kernel(AddRmsNormParams p) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  __shared__ float scratch[32];
  const int i = blockIdx.x;
  const int r = p.rows ? p.rows[i] : i;
  float* x = p.x + static_cast<size_t>(r) * p.dim;
  const float* d = p.delta ? p.delta + static_cast<size_t>(r) * p.delta_rows * p.dim : nullptr;
  float ss = 0.0f;
  // Unrolled: a row's columns are few per thread, and each is a chain of loads (the residual and
  // its delta rows), so several columns' loads go out together.
#pragma unroll 4
  for (int c = threadIdx.x; c < p.dim; c += blockDim.x) {
    float v = x[c];
    if (d) {
      float sum = d[c];
#pragma unroll 4
      for (int j = 1; j < p.delta_rows; ++j) sum += d[static_cast<size_t>(j) * p.dim + c];
      v += sum;
      x[c] = v;
    }
    ss += v * v;
  }
  if (!p.out) return;  // the add alone (the same for every thread of the block)
  ss = internal::block_sum(ss, scratch);
  const float scale = rsqrtf(ss / static_cast<float>(p.dim) + p.eps);
  __nv_bfloat16* out = p.out + static_cast<size_t>(i) * p.dim;
  for (int c = threadIdx.x; c < p.dim; c += blockDim.x) {
    out[c] = __float2bfloat16_rn(x[c] * scale * p.weight[c]);
  }
}

}  // namespace

cudaError_t add_rms_norm(const AddRmsNormParams& p, cudaStream_t stream) {
  if (p.num_rows < 0 || p.dim <= 0 || p.delta_rows < 1 || !p.x || !p.weight != !p.out ||
      (!p.out && !p.delta))
    return cudaErrorInvalidValue;
  if (p.num_rows == 0) return cudaSuccess;
  // About four columns a thread: a row is one block, and at decode's few rows the block's
  // latency is the kernel's.
  const int threads = std::clamp((p.dim / 4 + 31) / 32 * 32, 128, 1024);
  return internal::launch(add_rms_norm_kernel, dim3(p.num_rows), dim3(threads), 0, stream, p);
}

}  // namespace hr::kernels
