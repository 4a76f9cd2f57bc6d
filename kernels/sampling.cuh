// Token sampling on the GPU, one block per logits row, so that only token ids come back to the
// host: greedy (temperature <= 0 or top_k == 1; ties go to the lowest id), or temperature with
// top-k and top-p. The kept set is found by bisection on a threshold (top-k: the k highest
// logits; top-p: the smallest highest-probability set whose mass reaches top_p; ties at the
// threshold are all kept), and the draw walks the kept tokens in id order with a uniform number
// derived from the row's 64-bit `random` (same inputs, same token).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hr::kernels {

struct SampleParams {
  float temperature = 0.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0: no limit
  int32_t reserved = 0;
  uint64_t random = 0;
};

// logits: [num_rows, vocab] fp32; params: [num_rows]; tokens: [num_rows]. NaN logits are never
// picked; a row of nothing but NaN gets token -1.
cudaError_t sample_tokens(const float* logits, int num_rows, int vocab, const SampleParams* params,
                          int32_t* tokens, cudaStream_t stream);

}  // namespace hr::kernels
