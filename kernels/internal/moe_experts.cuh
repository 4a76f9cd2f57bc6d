// What the experts' kernels share (internal to kernels/): SwiGLU's gate and an expert's place
// among the weights a rank holds; and the grouped GEMM on Hopper's warpgroups
// (moe_gemm_wgmma.cu), which moe_experts launches.
#pragma once

#include <cuda_runtime.h>

#include "kernels/moe.cuh"

namespace hr::kernels::internal {

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

// Expert e's index among the weights held (expert parallelism), or -1 when they do not hold it.
__device__ __forceinline__ int held_expert(const MoeExpertsParams& p, int e) {
  if (p.num_local_experts == 0) return e;
  const int i = e - p.first_expert;
  return i >= 0 && i < p.num_local_experts ? i : -1;
}

// A grouped-GEMM block's tile of sorted rows from row0: each row's pair (-1: padding) and, for
// gate/up, its token (the row of x it reads), into shared memory. Every thread calls it; it
// synchronises the block.
template <bool kGateUp>
__device__ __forceinline__ void stage_tile_rows(const MoeExpertsParams& p, int row0, int* pair_s,
                                                int* token_s) {
  for (int r = threadIdx.x; r < kMoeTile; r += blockDim.x) {
    const int pair = p.layout.sorted_pairs[row0 + r];
    pair_s[r] = pair;
    if (kGateUp) token_s[r] = pair < 0 ? -1 : pair / p.top_k;
  }
  __syncthreads();
}

// The held expert's gate/up weights (its gate rows, then its up rows) or down weights.
template <bool kGateUp>
__device__ __forceinline__ const __nv_bfloat16* expert_weights(const MoeExpertsParams& p,
                                                               int held) {
  return kGateUp ? p.w_gate_up + static_cast<size_t>(held) * 2 * p.ffn * p.dim
                 : p.w_down + static_cast<size_t>(held) * p.dim * p.ffn;
}

// gate/up, then down, over the sorted tiles with wgmma (MoeKernel::kGroupedGemmWarpgroup);
// cudaErrorNotSupported on a GPU other than Hopper's.
cudaError_t moe_grouped_gemm_wgmma(const MoeExpertsParams& p, cudaStream_t stream);

}  // namespace hr::kernels::internal
