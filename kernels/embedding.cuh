// Embedding gather: the residual stream's first value, out[t, :] = float(table[id(t), :]), where
// id(t) is fed_tokens[fed_rows[t]] when fed_rows is given and fed_rows[t] >= 0 (a token sampled on
// the device by the step before), else ids[t].
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace hr::kernels {

// table: [vocab, dim] bf16; ids: [num_tokens] (each in [0, vocab)); fed_rows: [num_tokens] or
// null; fed_tokens: the previous step's sampled tokens (needed with fed_rows); out: [num_tokens,
// dim] fp32. dim must be a multiple of 8 and table and out 16-byte aligned. An id outside [0,
// vocab) (a fed -1 from the sampler) reads row 0 instead of memory outside the table.
// ids_out: [num_tokens] or null: each row's id(t) as given or fed (before that replacement), for
// the sampler's penalties. With table and out both null, ids_out alone (a later pipeline stage,
// whose residual stream comes from the stage before, still samples with penalties).
cudaError_t embedding_gather(const __nv_bfloat16* table, const int32_t* ids,
                             const int32_t* fed_rows, const int32_t* fed_tokens, int num_tokens,
                             int vocab, int dim, float* out, int32_t* ids_out, cudaStream_t stream);

}  // namespace hr::kernels
