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
