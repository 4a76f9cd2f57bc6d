// One query or key head of one token, RMS-normalised with its own weights (Qwen3's q_norm and
// k_norm) and rotated (rotate-half, inv_freq), as one warp: rope_write_kv's normalised form and the
// q/k/v GEMV's (gemv.cuh, GemvRope::q_norm) compute it alike, so the two give the same bits.
#pragma once

#include <cuda_bf16.h>

#include "kernels/internal/common.cuh"

namespace hr::kernels::internal {

// `row`: the head's hd values (fp32), plus `bias` (the head's, or null); `load` reads row[i]
// (plain, or through L2 where other blocks wrote it in this launch). The rotated values go to
// out[0 .. hd) in bf16.
template <typename Load>
__device__ __forceinline__ void norm_rope_head(Load load, const float* bias, const float* weight,
                                               int hd, float eps, float pos, const float* inv_freq,
                                               __nv_bfloat16* out, int lane) {
  const int half = hd / 2;
  float ss = 0.0f;
  for (int i = lane; i < hd; i += 32) {
    const float v = load(i) + (bias ? bias[i] : 0.0f);
    ss += v * v;
  }
  const float scale = rsqrtf(warp_sum(ss) / static_cast<float>(hd) + eps);
  for (int i = lane; i < half; i += 32) {
    float a = load(i), b = load(i + half);
    if (bias) {
      a += bias[i];
      b += bias[i + half];
    }
    a *= scale * weight[i];
    b *= scale * weight[i + half];
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    const float ra = a * c - b * s, rb = b * c + a * s;
    out[i] = __float2bfloat16_rn(ra);
    out[i + half] = __float2bfloat16_rn(rb);
  }
}

}  // namespace hr::kernels::internal
