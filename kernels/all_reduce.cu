// One-shot all-reduce over peer pointers, and the fused all-reduce + residual add + RMSNorm.
#include <algorithm>

#include "kernels/all_reduce.cuh"
#include "kernels/internal/common.cuh"

namespace hr::kernels {
namespace {

// Each thread sums whole float4s (and the tail one float at a time) over the inputs in order.
__global__ void peer_sum_kernel(PeerSumParams p) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t start = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t vecs = p.n / 4;
  for (size_t i = start; i < vecs; i += stride) {
    float4 s = reinterpret_cast<const float4*>(p.in[0])[i];
    for (int r = 1; r < p.num_inputs; ++r) {
      const float4 v = reinterpret_cast<const float4*>(p.in[r])[i];
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
    for (int k = 0; k < p.num_outputs; ++k) reinterpret_cast<float4*>(p.out[k])[i] = s;
  }
  for (size_t i = vecs * 4 + start; i < p.n; i += stride) {
    float s = p.in[0][i];
    for (int r = 1; r < p.num_inputs; ++r) s += p.in[r][i];
    for (int k = 0; k < p.num_outputs; ++k) p.out[k][i] = s;
  }
}

__global__ void all_reduce_add_rms_norm_kernel(AllReduceAddRmsNormParams p) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  __shared__ float scratch[32];
  const size_t row = static_cast<size_t>(blockIdx.x) * p.dim;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < p.dim; c += blockDim.x) {
    float sum = p.partial[0][row + c];
    for (int r = 1; r < p.num_ranks; ++r) sum += p.partial[r][row + c];
    const float v = p.x[0][row + c] + sum;
    for (int r = 0; r < p.num_ranks; ++r) p.x[r][row + c] = v;
    ss += v * v;
  }
  ss = internal::block_sum(ss, scratch);
  if (p.out[0] == nullptr) return;
  const float scale = rsqrtf(ss / static_cast<float>(p.dim) + p.eps);
  for (int c = threadIdx.x; c < p.dim; c += blockDim.x) {
    const __nv_bfloat16 y = __float2bfloat16_rn(p.x[0][row + c] * scale * p.weight[c]);
    for (int r = 0; r < p.num_ranks; ++r) p.out[r][row + c] = y;
  }
}

bool valid_ranks(int n) { return n >= 1 && n <= kMaxPeerRanks; }

}  // namespace

cudaError_t peer_sum(const PeerSumParams& p, cudaStream_t stream) {
  if (!valid_ranks(p.num_inputs) || !valid_ranks(p.num_outputs)) return cudaErrorInvalidValue;
  for (int r = 0; r < p.num_inputs; ++r) {
    if (p.in[r] == nullptr || !internal::aligned16(p.in[r])) return cudaErrorInvalidValue;
  }
  for (int k = 0; k < p.num_outputs; ++k) {
    if (p.out[k] == nullptr || !internal::aligned16(p.out[k])) return cudaErrorInvalidValue;
  }
  if (p.n == 0) return cudaSuccess;
  const int threads = 256;
  const size_t vecs = std::max<size_t>(1, (p.n + 3) / 4);
  const int blocks = static_cast<int>(std::min<size_t>((vecs + threads - 1) / threads, 1024));
  return internal::launch(peer_sum_kernel, dim3(blocks), dim3(threads), 0, stream, p);
}

cudaError_t all_reduce_add_rms_norm(const AllReduceAddRmsNormParams& p, cudaStream_t stream) {
  if (!valid_ranks(p.num_ranks) || p.num_rows < 0 || p.dim <= 0) return cudaErrorInvalidValue;
  for (int r = 0; r < p.num_ranks; ++r) {
    if (p.partial[r] == nullptr || p.x[r] == nullptr) return cudaErrorInvalidValue;
    if ((p.out[r] == nullptr) != (p.out[0] == nullptr)) return cudaErrorInvalidValue;
  }
  if (p.out[0] != nullptr && p.weight == nullptr) return cudaErrorInvalidValue;
  if (p.num_rows == 0) return cudaSuccess;
  const int threads = std::clamp((p.dim / 4 + 31) / 32 * 32, 128, 1024);
  return internal::launch(all_reduce_add_rms_norm_kernel, dim3(p.num_rows), dim3(threads), 0,
                          stream, p);
}

}  // namespace hr::kernels
