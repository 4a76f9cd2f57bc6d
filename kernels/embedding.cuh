// Embedding gather: the residual stream's first value, out[t, :] = float(table[ids[t], :]).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace hr::kernels {

// table: [vocab, dim] bf16; ids: [num_tokens] (each in [0, vocab)); out: [num_tokens, dim] fp32.
// dim must be a multiple of 8 and the pointers 16-byte aligned.
cudaError_t embedding_gather(const __nv_bfloat16* table, const int32_t* ids, int num_tokens, int dim,
                             float* out, cudaStream_t stream);

}  // namespace hr::kernels
