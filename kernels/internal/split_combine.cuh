// Merging a decode's key-range splits (flash-decoding), shared by paged_attention_combine and the
// attention kernels that merge in place (internal to kernels/). Each split s of a token's head left
// its normalised output o_s, running max m_s and sum l_s; the merged output is
// sum_s w_s o_s / sum_s w_s with w_s = l_s exp(m_s - max_s m_s). Empty splits (l_s = 0) weigh
// nothing and are not read.
#pragma once

#include "kernels/internal/common.cuh"
#include "kernels/paged_attention.cuh"

namespace hr::kernels::internal {

constexpr int kMaxMergeDims = 4;  // head dims per lane: head_dim <= 128

// One warp merges head `head` of combine item c into p.out: lanes share out the splits to find
// the weights, then each lane sums dims lane, lane + 32, ... over the splits, taking each split's
// weight from the lane that computed it. Partial results are read from L2 (__ldcg): in the
// in-place merge other blocks of the same launch wrote them.
__device__ __forceinline__ void merge_head(const PagedAttentionParams& p,
                                           const AttentionCombineItem& c, int head) {
  const int lane = threadIdx.x % 32;
  auto slot_of = [&](int s) {
    return static_cast<size_t>(c.first_partial + s) * p.num_heads + head;
  };
  float mx = -INFINITY;
  for (int s = lane; s < c.num_splits; s += 32) {
    if (__ldcg(p.partial_ml + slot_of(s) * 2 + 1) > 0.0f)
      mx = fmaxf(mx, __ldcg(p.partial_ml + slot_of(s) * 2));
  }
  mx = warp_max(mx);
  float den = 0.0f;
  for (int s = lane; s < c.num_splits; s += 32) {
    const float l = __ldcg(p.partial_ml + slot_of(s) * 2 + 1);
    if (l > 0.0f) den += l * __expf(__ldcg(p.partial_ml + slot_of(s) * 2) - mx);
  }
  den = warp_sum(den);
  const float inv = den > 0.0f ? 1.0f / den : 0.0f;
  const int dims = p.head_dim / 32;
  float acc[kMaxMergeDims] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s0 = 0; s0 < c.num_splits; s0 += 32) {
    float w = 0.0f;  // this lane's split's share of the output
    if (s0 + lane < c.num_splits) {
      const float l = __ldcg(p.partial_ml + slot_of(s0 + lane) * 2 + 1);
      if (l > 0.0f) w = l * __expf(__ldcg(p.partial_ml + slot_of(s0 + lane) * 2) - mx) * inv;
    }
    const int n = min(32, c.num_splits - s0);
    for (int j = 0; j < n; ++j) {
      const float wj = __shfl_sync(0xffffffffu, w, j);
      if (wj == 0.0f) continue;  // warp-uniform
      const float* o = p.partial_out + slot_of(s0 + j) * p.head_dim + lane;
#pragma unroll
      for (int q = 0; q < kMaxMergeDims; ++q) {
        if (q < dims) acc[q] += wj * __ldcg(o + 32 * q);
      }
    }
  }
  __nv_bfloat16* out =
      p.out + (static_cast<size_t>(c.q_row) * p.num_heads + head) * p.head_dim + lane;
#pragma unroll
  for (int q = 0; q < kMaxMergeDims; ++q) {
    if (q < dims) out[32 * q] = __float2bfloat16_rn(acc[q]);
  }
}

// Called by every thread of the block that ran split item `it` for KV head kvh, once the block's
// partial results (all `group` heads) are written, when p.combine_counters is set: the last of the
// item's splits to get here, counted per (combine item, KV head), merges them into p.out (a warp
// per head) and sets its counter back to zero for the next launch.
__device__ __forceinline__ void merge_if_last_split(const PagedAttentionParams& p,
                                                    const AttentionWorkItem& it, int kvh,
                                                    int group) {
  __shared__ int last;
  __threadfence();  // this thread's partial results, before the count that publishes them
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    int32_t* counter = p.combine_counters + static_cast<size_t>(it.combine) * p.num_kv_heads + kvh;
    last = atomicAdd(counter, 1) == p.combine_items[it.combine].num_splits - 1;
    if (last) {
      atomicExch(counter, 0);
      __threadfence();  // the other splits' results, counted before ours, are read after the count
    }
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const AttentionCombineItem c = p.combine_items[it.combine];
  for (int h = threadIdx.x / 32; h < group; h += blockDim.x / 32) merge_head(p, c, kvh * group + h);
}

// An empty split (decode graphs give every sequence the same number of splits): its partial result
// weighs nothing, and it still counts towards the merge. An item without keys that writes out
// (the planner makes none) writes zeros, as the CUDA-core kernel does. Called by every thread of
// the block.
__device__ __forceinline__ void finish_empty_split(const PagedAttentionParams& p,
                                                   const AttentionWorkItem& it, int kvh,
                                                   int group) {
  if (it.partial < 0) {  // the same for the whole block
    const int per_token = group * p.head_dim;
    for (int e = threadIdx.x; e < it.q_len * per_token; e += blockDim.x) {
      const int t = e / per_token, r = e % per_token;
      p.out[(static_cast<size_t>(it.q_row + t) * p.num_heads + kvh * group) * p.head_dim + r] =
          __float2bfloat16(0.0f);
    }
    return;
  }
  for (int h = threadIdx.x; h < group; h += blockDim.x) {
    const size_t slot = static_cast<size_t>(it.partial) * p.num_heads + kvh * group + h;
    p.partial_ml[slot * 2] = -INFINITY;
    p.partial_ml[slot * 2 + 1] = 0.0f;
  }
  if (p.combine_counters) merge_if_last_split(p, it, kvh, group);
}

}  // namespace hr::kernels::internal
