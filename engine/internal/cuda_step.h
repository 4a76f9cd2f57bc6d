// Shared by the CUDA backend's sources (cuda_backend*.cc): the layout of one step's inputs in the
// staging buffers, and the step size up to which the GEMV kernel runs the matrix products.
// Private to engine/.
#pragma once

#include <cstddef>

#include "engine/cuda_backend.h"
#include "kernels/paged_attention.cuh"

namespace hr::engine {

inline size_t align16(size_t n) { return (n + 15) & ~size_t{15}; }

// Steps of up to this many tokens use the GEMV kernel: on an H100 it reads the 8B model's weight
// matrices at 0.56-1.0 of copy bandwidth for one or two rows against cuBLASLt's 0.45-0.92, ties at
// four and falls behind by eight (bench_gpu.sh's weight_read_fraction).
constexpr int kGemvRows = 2;

// Steps of up to this many tokens run a MoE layer's experts as GEMVs (each active expert's
// weights streamed once for all its rows), larger ones as the grouped GEMM on tensor cores.
constexpr int kMoeGemvTokens = 16;
// ... up to this many where the grouped GEMM runs on warpgroups: on an H200 it took Qwen3-30B-A3B's
// batch-16 decode to 706 tok/s against the GEMVs' 631 (32x32 warps: 601).
constexpr int kMoeGemvTokensWarpgroup = 8;

// Steps of at least this many tokens take the router's logits as the tiled product
// (moe_router_tiles); smaller ones, the row kernel. The tiled product has a block per 64 tokens
// (one tile of experts up to 128), each a serial pass over the hidden size: it runs about as long
// for 16 tokens as for 8,192 (on an H200, Qwen3-30B-A3B's routing took 164-180 us a layer at
// batch 16-256, a third of the batch-16 step, and 242 us at 8,192 tokens). The row kernel's time
// grows with the tokens (~0.1 us each there: 0.6 ms a layer more than the tiles at 8,192), so
// the two cross near 1,600 tokens.
constexpr int kMoeTiledRouteTokens = 1536;

// Byte offsets of one step's inputs inside the staging buffers (each 16-byte aligned).
struct CudaBackend::StepLayout {
  size_t token_ids = 0, fed_rows = 0, positions = 0, slots = 0, logits_rows = 0, block_table = 0,
         decode_items = 0, prefill_items = 0, combine_items = 0, sample_params = 0, total = 0;
  int num_tokens = 0, num_logits = 0;
  // The block tables' row pitch on the device (the attention kernels' max_blocks_per_seq), and
  // the columns given (packed at that width on the host; the rest of each device row is not read).
  int max_blocks_per_seq = 0, table_cols = 0;
  int num_decode = 0, num_prefill = 0, num_combine = 0;
  kernels::AttentionKernel decode_kernel =
      kernels::AttentionKernel::kDecode;  // for the decode items
  bool fused = false;  // the small-batch path with norms and activation folded into GEMVs
};

}  // namespace hr::engine
