// The prefill half of paged_attention on tensor cores (internal: launched by paged_attention.cu).
#pragma once

#include <cuda_runtime.h>

#include "kernels/paged_attention.cuh"

namespace hr::kernels::internal {

// Runs work items of up to kAttentionPrefillRows rows each (prefill tiles, and decodes routed here)
// with bf16 mma.sync products and fp32 accumulation. head_dim 32, 64 or 128.
cudaError_t prefill_attention_tc(const PagedAttentionParams& p, const AttentionWorkItem* items,
                                 int num_items, cudaStream_t stream);

}  // namespace hr::kernels::internal
