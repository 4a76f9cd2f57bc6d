// The tensor-core decode half of paged_attention (internal: launched by paged_attention.cu).
#pragma once

#include <cuda_runtime.h>

#include "kernels/paged_attention.cuh"

namespace hr::kernels::internal {

// Runs decode work items (q_len == 1, at most kAttentionDecodeTcRows group heads) with bf16
// mma.sync products and fp32 accumulation, the keys of each tile shared out among the block's
// warps. head_dim 32, 64 or 128.
cudaError_t decode_attention_tc(const PagedAttentionParams& p, const AttentionWorkItem* items,
                                int num_items, cudaStream_t stream);

}  // namespace hr::kernels::internal
