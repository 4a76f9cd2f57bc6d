// What the experts' kernels share (internal to kernels/): SwiGLU's gate, an expert's place among
// the weights a rank holds, and the grouped GEMMs' tile rows, epilogue and launch; and the
// grouped GEMM on Hopper's warpgroups (moe_gemm_wgmma.cu), which moe_experts launches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/internal/common.cuh"
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

// The row of A that tile row r reads: its token's row of x (gate/up), or its own sorted row of
// act (down); -1 for padding.
template <bool kGateUp>
__device__ __forceinline__ int tile_a_row(const int* pair_s, const int* token_s, int row0, int r) {
  return kGateUp ? token_s[r] : pair_s[r] < 0 ? -1 : row0 + r;
}

// A grouped GEMM's two adjacent output columns col, col + 1 (col even, as N is) of sorted row
// `row`, whose pair is `pair`: gate/up stores SwiGLU's activation from the gate values v and the
// up values u; down stores the values times the pair's routing weight.
template <bool kGateUp>
__device__ __forceinline__ void store_column_pair(const MoeExpertsParams& p, int row, int pair,
                                                  float weight, int col, float v0, float v1,
                                                  float u0, float u1) {
  if (kGateUp) {
    *reinterpret_cast<__nv_bfloat162*>(p.act + static_cast<size_t>(row) * p.ffn + col) =
        __floats2bfloat162_rn(silu(v0) * u0, silu(v1) * u1);
  } else {
    *reinterpret_cast<float2*>(p.out + static_cast<size_t>(pair) * p.dim + col) =
        make_float2(v0 * weight, v1 * weight);
  }
}

// A grouped-GEMM kernel's launch shape: output columns and threads a block, dynamic shared memory.
struct TileLaunch {
  int cols;
  int threads;
  size_t smem;
};

// gate/up, then down, over the sorted tiles: a block per (tile, the kernel's columns), shared
// memory past 48 KiB asked for on each device (one GPU a rank: a process has several).
template <auto kGateUpKernel, auto kDownKernel>
cudaError_t launch_gate_up_then_down(const MoeExpertsParams& p, TileLaunch gate_up, TileLaunch down,
                                     cudaStream_t stream) {
  cudaError_t err;
  if ((err = allow_dynamic_smem<kGateUpKernel>(gate_up.smem)) != cudaSuccess ||
      (err = allow_dynamic_smem<kDownKernel>(down.smem)) != cudaSuccess)
    return err;
  const int tiles = p.capacity / kMoeTile;
  err = launch(kGateUpKernel, dim3((p.ffn + gate_up.cols - 1) / gate_up.cols, tiles),
               dim3(gate_up.threads), gate_up.smem, stream, p);
  if (err != cudaSuccess) return err;
  return launch(kDownKernel, dim3((p.dim + down.cols - 1) / down.cols, tiles), dim3(down.threads),
                down.smem, stream, p);
}

// gate/up, then down, over the sorted tiles with wgmma (MoeKernel::kGroupedGemmWarpgroup);
// cudaErrorNotSupported on a GPU other than Hopper's.
cudaError_t moe_grouped_gemm_wgmma(const MoeExpertsParams& p, cudaStream_t stream);

}  // namespace hr::kernels::internal
