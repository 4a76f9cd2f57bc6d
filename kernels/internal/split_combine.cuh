// Merging a decode's key-range splits (flash-decoding), shared by paged_attention_combine and the
// attention kernels that merge in place (internal to kernels/). Each split s of a token's head left
// its normalised output o_s, running max m_s and sum l_s; the merged output is
// sum_s w_s o_s / sum_s w_s with w_s = l_s exp(m_s - max_s m_s). Empty splits (l_s = 0) weigh nothing.
#pragma once

#include "kernels/internal/common.cuh"
#include "kernels/paged_attention.cuh"

namespace hr::kernels::internal {

// Element d of head `head`'s merged output for combine item c. The partial results are read from
// L2 (__ldcg): in the in-place merge they were written by other blocks of the same launch.
__device__ __forceinline__ float merge_splits(const PagedAttentionParams& p, const AttentionCombineItem& c, int head,
                                              int d) {
  float mx = -INFINITY;
  for (int s = 0; s < c.num_splits; ++s) {
    mx = fmaxf(mx, __ldcg(p.partial_ml + (static_cast<size_t>(c.first_partial + s) * p.num_heads + head) * 2));
  }
  float num = 0.0f, den = 0.0f;
  for (int s = 0; s < c.num_splits; ++s) {
    const size_t slot = static_cast<size_t>(c.first_partial + s) * p.num_heads + head;
    const float ms = __ldcg(p.partial_ml + slot * 2), ls = __ldcg(p.partial_ml + slot * 2 + 1);
    if (ls <= 0.0f) continue;
    const float w = ls * __expf(ms - mx);
    num += w * __ldcg(p.partial_out + slot * p.head_dim + d);
    den += w;
  }
  return den > 0.0f ? num / den : 0.0f;
}

// Called by every thread of the block that ran split item `it` for KV head kvh, once the block's
// partial results (all `group` heads) are written, when p.combine_counters is set: the last of the
// item's splits to get here, counted per (combine item, KV head), merges them into p.out and sets
// its counter back to zero for the next launch.
__device__ __forceinline__ void merge_if_last_split(const PagedAttentionParams& p, const AttentionWorkItem& it,
                                                    int kvh, int group) {
  __shared__ int last;
  __threadfence();  // this thread's partial results are visible before the count says so
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t* counter = p.combine_counters + static_cast<size_t>(it.combine) * p.num_kv_heads + kvh;
    last = atomicAdd(counter, 1) == p.combine_items[it.combine].num_splits - 1;
    if (last) atomicExch(counter, 0);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // the other splits' results, counted before ours, are read after the count
  const AttentionCombineItem c = p.combine_items[it.combine];
  for (int e = threadIdx.x; e < group * p.head_dim; e += blockDim.x) {
    const int head = kvh * group + e / p.head_dim, d = e % p.head_dim;
    p.out[(static_cast<size_t>(c.q_row) * p.num_heads + head) * p.head_dim + d] =
        __float2bfloat16_rn(merge_splits(p, c, head, d));
  }
}

}  // namespace hr::kernels::internal
