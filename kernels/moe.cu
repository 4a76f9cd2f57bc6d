// Mixture-of-experts kernels (moe.cuh): routing, the sorted layout, and the experts' GEMV and
// grouped-GEMM forms.
#include <algorithm>

#include "kernels/internal/common.cuh"
#include "kernels/internal/mma.cuh"
#include "kernels/internal/moe_experts.cuh"
#include "kernels/moe.cuh"

namespace hr::kernels {
namespace {

using internal::bf16x8_to_float;
using internal::expert_weights;
using internal::held_expert;
using internal::silu;
using internal::stage_tile_rows;
using internal::store_column_pair;
using internal::tile_a_row;
using internal::warp_max;
using internal::warp_sum;

// Tokens per routing block: each router row read once for them.
constexpr int kRouteTokens = kMoeFusedRouteTokens;
constexpr int kRouteWarps = 4;
constexpr int kRouteThreads = kRouteWarps * 32;
constexpr int kRouteUnroll = 4;    // 16-byte router loads in flight per lane
constexpr int kTopkThreads = 256;  // the separate top-k kernel: a warp per token
constexpr int kAlignThreads = 1024;

// The warp's best (value, id) over the lanes' candidates: the larger value, ties to the lower id.
__device__ __forceinline__ void warp_argmax(float& v, int& id) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oid = __shfl_xor_sync(0xffffffffu, id, o);
    if (ov > v || (ov == v && oid >= 0 && (id < 0 || oid < id))) {
      v = ov;
      id = oid;
    }
  }
}

// The best of choice[e] over experts e with allowed(e), best first, as a warp; -1 when none.
template <typename Allowed>
__device__ __forceinline__ int warp_best(const float* choice, int n, int lane, Allowed allowed) {
  float v = -INFINITY;
  int id = -1;
  for (int e = lane; e < n; e += 32) {
    if (!allowed(e)) continue;
    if (id < 0 || choice[e] > v) {
      v = choice[e];
      id = e;
    }
  }
  warp_argmax(v, id);
  return id;
}

// Warps that share one expert's dot products (each a strided share of the columns): at decode's
// few tokens, enough blocks to keep memory busy and one round of loads per lane; at more tokens
// one (every block also sums its tokens' squares: the fewer blocks a token has, the better).
__host__ __device__ constexpr int route_warps_per_expert(int num_experts, int num_tokens) {
  if (num_tokens > kRouteTokens) return 1;
  return num_experts >= 512 ? 1 : num_experts >= 256 ? 2 : 4;
}

// Scores and the top k of token t, as one warp, from its logits (read through L2: in the fused
// form other blocks wrote them in this launch; already divided by the row's rms). `score`,
// `choice`: kMoeMaxExperts floats; `group`: kMoeMaxGroups.
__device__ void route_token(const MoeRouteParams& p, int t, float* score, float* choice,
                            float* group, int lane) {
  const MoeRouting& r = p.routing;
  const int E = r.num_experts, K = r.top_k;
  for (int e = lane; e < E; e += 32) score[e] = __ldcg(p.logits + static_cast<size_t>(t) * E + e);
  __syncwarp();
  if (!r.sigmoid) {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, score[e]);
    mx = warp_max(mx);
    float sum = 0;
    for (int e = lane; e < E; e += 32) sum += score[e] = __expf(score[e] - mx);
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) choice[e] = score[e] /= sum;
  } else {
    for (int e = lane; e < E; e += 32) {
      score[e] = 1.0f / (1.0f + __expf(-score[e]));
      choice[e] = score[e] + (p.bias ? p.bias[e] : 0.0f);
    }
  }
  __syncwarp();
  const int G = r.num_groups > 1 ? r.num_groups : 1, per = E / G;
  uint32_t kept_groups = 0xffffffffu;
  if (G > 1) {
    // Each group's score: the sum of its two best choices; the topk_groups best groups stay.
    if (lane < G) {
      float a = -INFINITY, b = -INFINITY;
      for (int e = lane * per; e < (lane + 1) * per; ++e) {
        if (choice[e] > a) {
          b = a;
          a = choice[e];
        } else if (choice[e] > b) {
          b = choice[e];
        }
      }
      group[lane] = per > 1 ? a + b : a;
    }
    __syncwarp();
    kept_groups = 0;
    for (int j = 0; j < r.topk_groups; ++j) {
      const int g =
          warp_best(group, G, lane, [&](int g) { return ((kept_groups >> g) & 1u) == 0; });
      if (g >= 0) kept_groups |= 1u << g;
    }
  }
  // The top k, one warp-wide argmax each; then the weights from the unbiased scores. Each lane
  // keeps which of its experts (lane, lane + 32, ...) are taken, and lane j the j-th choice, in
  // registers.
  uint32_t mine_taken = 0;
  int my_id = -1;
  float total = 0;
  for (int j = 0; j < K; ++j) {
    float v = -INFINITY;
    int id = -1;
    for (int k = 0, e = lane; e < E; ++k, e += 32) {
      if (((mine_taken >> k) & 1u) != 0 || ((kept_groups >> (e / per)) & 1u) == 0) continue;
      if (id < 0 || choice[e] > v) {
        v = choice[e];
        id = e;
      }
    }
    warp_argmax(v, id);
    if (lane == j) my_id = id;
    if (id >= 0) {
      if (id % 32 == lane) mine_taken |= 1u << (id / 32);
      total += score[id];
    }
  }
  if (lane < K) {
    float w = my_id >= 0 ? score[my_id] : 0.0f;
    if (r.renormalize) w /= total;
    const size_t at = static_cast<size_t>(t) * K + lane;
    p.topk_ids[at] = my_id >= 0 ? my_id : 0;
    p.topk_weights[at] = w * r.scaling;
  }
  __syncwarp();  // score and choice are reused for the warp's next token
}

// The sorted layout of `num_pairs` pairs whose experts are `ids`, by one block of any size (each
// thread a run of consecutive experts in the scans). Called by every thread of the block.
__device__ void align_block(const int32_t* ids, int num_pairs, int E, int capacity,
                            const MoeLayout& l) {
  __shared__ int count_s[kMoeMaxExperts];
  __shared__ int cursor_s[kMoeMaxExperts];
  __shared__ int offset_s[kMoeMaxExperts + 1];
  __shared__ int warp_rows_s[32], warp_active_s[32];
  __shared__ int num_active_s;
  const int nthreads = blockDim.x, tid = threadIdx.x;
  for (int x = tid; x < E; x += nthreads) count_s[x] = cursor_s[x] = 0;
  __syncthreads();
  for (int i = tid; i < num_pairs; i += nthreads) atomicAdd(&count_s[__ldcg(ids + i)], 1);
  __syncthreads();
  // Exclusive scans over the experts: the padded offsets, and each active expert's place in the
  // list. Thread tid takes experts [e0, e1).
  const int per = (E + nthreads - 1) / nthreads;
  const int e0 = min(E, tid * per), e1 = min(E, e0 + per);
  const int lane = tid % 32, warp = tid / 32;
  int rows = 0, active = 0;
  for (int e = e0; e < e1; ++e) {
    rows += (count_s[e] + kMoeTile - 1) / kMoeTile * kMoeTile;
    active += count_s[e] > 0 ? 1 : 0;
  }
  int rows_incl = rows, active_incl = active;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int r = __shfl_up_sync(0xffffffffu, rows_incl, o);
    const int a = __shfl_up_sync(0xffffffffu, active_incl, o);
    if (lane >= o) {
      rows_incl += r;
      active_incl += a;
    }
  }
  if (lane == 31) {
    warp_rows_s[warp] = rows_incl;
    warp_active_s[warp] = active_incl;
  }
  __syncthreads();
  int row = rows_incl - rows, place = active_incl - active;
  for (int w = 0; w < warp; ++w) {
    row += warp_rows_s[w];
    place += warp_active_s[w];
  }
  for (int e = e0; e < e1; ++e) {
    offset_s[e] = row;
    row += (count_s[e] + kMoeTile - 1) / kMoeTile * kMoeTile;
    if (count_s[e] > 0) l.active_experts[place++] = e;
  }
  if (e0 < e1 && e1 == E) {
    offset_s[E] = row;
    num_active_s = place;
  }
  __syncthreads();
  for (int i = num_active_s + tid; i < E; i += nthreads) l.active_experts[i] = -1;
  for (int x = tid; x <= E; x += nthreads) {
    l.offsets[x] = offset_s[x];
    if (x < E) l.counts[x] = count_s[x];
  }
  for (int i = tid; i < capacity; i += nthreads) l.sorted_pairs[i] = -1;
  for (int tile = tid; tile < capacity / kMoeTile; tile += nthreads) {
    const int r0 = tile * kMoeTile;
    int lo = 0, hi = E;  // the expert whose rows hold r0: offset_s[lo] <= r0 < offset_s[lo + 1]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (offset_s[mid] <= r0)
        lo = mid;
      else
        hi = mid;
    }
    l.tile_experts[tile] = r0 < offset_s[E] ? lo : -1;
  }
  __syncthreads();  // the padding's -1 lands before the pairs
  for (int i = tid; i < num_pairs; i += nthreads) {
    const int x = __ldcg(ids + i);
    const int row = offset_s[x] + atomicAdd(&cursor_s[x], 1);
    l.sorted_pairs[row] = i;
    l.pair_rows[i] = row;
  }
}

// Four values of a normalised row into p.normed_out (bf16): resid[at .. at + 4) times the row's
// 1/rms and norm_weight[i .. i + 4) (`at` a multiple of 4: one float4).
__device__ __forceinline__ void store_normed4(const MoeRouteParams& p, size_t at, int i,
                                              float inv) {
  const float4 v = *reinterpret_cast<const float4*>(p.resid + at);
  const float4 g = __ldg(reinterpret_cast<const float4*>(p.norm_weight + i));
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(p.normed_out + at);
  out[0] = __floats2bfloat162_rn(v.x * inv * g.x, v.y * inv * g.y);
  out[1] = __floats2bfloat162_rn(v.z * inv * g.z, v.w * inv * g.w);
}

// Router logits: a block per (kRouteWarps / W experts, kRouteTokens tokens), W warps per expert
// (route_warps_per_expert) for all the block's tokens, the router row read once for them with
// kRouteUnroll loads in flight per lane. Of the residual-stream form, the dot with
// resid * norm_weight, times the row's 1/rms. With kFused (one token block: decode),
// the last block to finish takes every token's top k and sorts the pairs into p.layout: one
// launch for the whole routing.
template <bool kFused>
__global__ void __launch_bounds__(kRouteThreads) moe_logits_kernel(MoeRouteParams p) {
  internal::pdl_launch_dependents();
  __shared__ float part_s[kRouteWarps][kRouteTokens];
  const int E = p.routing.num_experts, D = p.dim;
  const int W = route_warps_per_expert(E, p.num_tokens), per_block = kRouteWarps / W;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = blockIdx.x * per_block + warp / W, slice = warp % W;
  // The router is constant: this warp's pieces of its row pulled into L2 while the kernel before
  // ends (launched programmatically; otherwise just ahead of the loads).
  if (e < E) {
    for (int i = (slice * 32 + lane) * 4; i < D; i += 128 * W)
      internal::prefetch_l2(p.router + static_cast<size_t>(e) * D + i);
  }
  internal::pdl_wait();
  const int t0 = blockIdx.y * kRouteTokens;
  const int nt = min(kRouteTokens, p.num_tokens - t0);
  // Of the residual-stream form, each token's 1/rms (every block the same sums, in the same
  // order), and this block's share of the normalised rows when asked for.
  __shared__ float ss_s[kRouteWarps][kRouteTokens];
  __shared__ float inv_rms_s[kRouteTokens];
  if (p.resid) {
    float ss[kRouteTokens] = {};
#pragma unroll
    for (int t = 0; t < kRouteTokens; ++t) {
      if (t >= nt) break;
      const float* row = p.resid + static_cast<size_t>(t0 + t) * D;
      // kRouteUnroll loads issued (predicated, not branched around) before their squares.
      for (int i0 = threadIdx.x * 4; i0 < D; i0 += kRouteThreads * 4 * kRouteUnroll) {
        float4 v[kRouteUnroll];
#pragma unroll
        for (int u = 0; u < kRouteUnroll; ++u) {
          const int i = i0 + u * kRouteThreads * 4;
          v[u] = i < D ? *reinterpret_cast<const float4*>(row + i) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kRouteUnroll; ++u)
          ss[t] += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
      }
    }
#pragma unroll
    for (int t = 0; t < kRouteTokens; ++t) {
      const float w = warp_sum(ss[t]);
      if (lane == 0) ss_s[warp][t] = w;
    }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < nt) {
      float total = 0;
      for (int k = 0; k < kRouteWarps; ++k) total += ss_s[k][threadIdx.x];
      inv_rms_s[threadIdx.x] = rsqrtf(total / static_cast<float>(D) + p.eps);
    }
    __syncthreads();
    if (p.normed_out) {
      const int per = (D / 4 + gridDim.x - 1) / gridDim.x * 4;
      const int c0 = blockIdx.x * per, c1 = min(D, c0 + per);
      for (int x = threadIdx.x * 4; x < nt * per; x += kRouteThreads * 4) {
        const int t = x / per, i = c0 + x % per;
        if (i >= c1) continue;
        store_normed4(p, static_cast<size_t>(t0 + t) * D + i, i, inv_rms_s[t]);
      }
    }
  }
  if (e < E) {
    float acc[kRouteTokens] = {};
    const float* w = p.router + static_cast<size_t>(e) * D;
    const int stride = 128 * W;
    // Every load of a round issued before the arithmetic that waits for it: the router's and
    // the norm weight's pieces, then each token's (predicated, not branched around; a piece past
    // the row reads as zeros).
    const float4 zero = make_float4(0, 0, 0, 0);
    for (int i0 = (slice * 32 + lane) * 4; i0 < D; i0 += stride * kRouteUnroll) {
      float4 wv[kRouteUnroll], g[kRouteUnroll];
#pragma unroll
      for (int u = 0; u < kRouteUnroll; ++u) {
        const int i = i0 + u * stride;
        wv[u] = i < D ? __ldg(reinterpret_cast<const float4*>(w + i)) : zero;
        if (p.resid)
          g[u] = i < D ? __ldg(reinterpret_cast<const float4*>(p.norm_weight + i)) : zero;
      }
      if (p.resid) {
#pragma unroll
        for (int u = 0; u < kRouteUnroll; ++u) {
          wv[u] =
              make_float4(wv[u].x * g[u].x, wv[u].y * g[u].y, wv[u].z * g[u].z, wv[u].w * g[u].w);
        }
      }
#pragma unroll
      for (int t = 0; t < kRouteTokens; ++t) {
        if (t >= nt) break;
        float4 xv[kRouteUnroll];
#pragma unroll
        for (int u = 0; u < kRouteUnroll; ++u) {
          const int i = i0 + u * stride;
          if (p.resid) {
            xv[u] = i < D ? *reinterpret_cast<const float4*>(p.resid +
                                                             static_cast<size_t>(t0 + t) * D + i)
                          : zero;
          } else {
            uint2 h = {0u, 0u};
            if (i < D)
              h = *reinterpret_cast<const uint2*>(p.x + static_cast<size_t>(t0 + t) * D + i);
            const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&h.x));
            const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&h.y));
            xv[u] = make_float4(a.x, a.y, b.x, b.y);
          }
        }
#pragma unroll
        for (int u = 0; u < kRouteUnroll; ++u)
          acc[t] += xv[u].x * wv[u].x + xv[u].y * wv[u].y + xv[u].z * wv[u].z + xv[u].w * wv[u].w;
      }
    }
#pragma unroll
    for (int t = 0; t < kRouteTokens; ++t) {
      const float s = warp_sum(acc[t]);
      if (lane == 0) part_s[warp][t] = s;
    }
  }
  __syncthreads();
  // Each expert's slices summed in slice order.
  for (int x = threadIdx.x; x < per_block * nt; x += kRouteThreads) {
    const int j = x / nt, t = x % nt, ej = blockIdx.x * per_block + j;
    if (ej >= E) continue;
    float s = 0;
    for (int k = 0; k < W; ++k) s += part_s[j * W + k][t];
    p.logits[static_cast<size_t>(t0 + t) * E + ej] = p.resid ? s * inv_rms_s[t] : s;
  }
  if constexpr (kFused) {
    __shared__ int last;
    __shared__ float score_s[kRouteWarps][kMoeMaxExperts];
    __shared__ float choice_s[kRouteWarps][kMoeMaxExperts];
    __shared__ float group_s[kRouteWarps][kMoeMaxGroups];
    __threadfence();  // this block's logits, before the count that publishes them
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      last = atomicAdd(p.counter, 1) == static_cast<int>(gridDim.x) - 1;
      if (last) {
        atomicExch(p.counter, 0);
        __threadfence();  // the other blocks' logits, counted before ours, are read after
      }
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int t = warp; t < nt; t += kRouteWarps)
      route_token(p, t0 + t, score_s[warp], choice_s[warp], group_s[warp], lane);
    __syncthreads();  // the block's top-k writes, before the sort reads them
    align_block(p.topk_ids, nt * p.routing.top_k, E, p.capacity, p.layout);
  }
}

// Router logits of many tokens (prefill) as a tiled product: a block per (kTileTokens tokens,
// kTileExperts experts), the rows' and the router's kTileK-column slices staged in shared memory
// (transposed: a thread reads its 4 tokens' and 8 experts' values of a column as float4s; stores
// and reads free of bank conflicts), each thread 4 tokens by 8 experts. Every row is read once per
// tile of experts (once in all for up to 128 experts), where the row kernel read it once per 4
// experts and summed its squares as often. Of the residual-stream form the staged values are resid
// * norm_weight, each token's sum of squares is taken from the same slices, and the 1/rms scales
// the logits at the end; the blocks of the first expert tile write the normalised bf16 rows when
// asked.
constexpr int kTileTokens = 64;
constexpr int kTileExperts = 128;
constexpr int kTileK = 32;
constexpr int kTileThreads = 256;

__global__ void __launch_bounds__(kTileThreads) moe_logits_tiled_kernel(MoeRouteParams p) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  __align__(16) __shared__ float a_s[kTileK][kTileTokens + 4];
  __align__(16) __shared__ float b_s[kTileK][kTileExperts + 4];
  __shared__ float half_s[2][kTileTokens];  // each token's sums of squares, by half of its columns
  __shared__ float inv_s[kTileTokens];
  const int T = p.num_tokens, E = p.routing.num_experts, D = p.dim;
  const int t0 = blockIdx.x * kTileTokens, e0 = blockIdx.y * kTileExperts;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const float4 zero = make_float4(0, 0, 0, 0);
  float acc[4][8] = {};
  // The staging: a warp takes 16 rows by 2 column groups (16 bytes each) of a slice, so that a
  // row's 32 bytes are one sector and the transposed stores fall on 32 banks. A thread stages one
  // token (the same in every slice) and keeps that token's sum of squares over its columns.
  const int warp = tid / 32, lane = tid % 32;
  const int a_row = (warp % 4) * 16 + lane / 2;
  float ss = 0;
  // A slice's values in registers: each thread's 2 row pieces (and their norm weights) and 4
  // router pieces, loaded a slice ahead so that their latency passes while the slice before is
  // multiplied.
  float4 a_reg[2], g_reg[2], b_reg[4];
  auto load_slice = [&](int k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int t = a_row, col = k0 + ((warp / 4 + 2 * i) * 2 + lane % 2) * 4;
      a_reg[i] = g_reg[i] = zero;
      if (t0 + t < T && col < D) {
        const size_t at = static_cast<size_t>(t0 + t) * D + col;
        if (p.resid) {
          a_reg[i] = *reinterpret_cast<const float4*>(p.resid + at);
          g_reg[i] = __ldg(reinterpret_cast<const float4*>(p.norm_weight + col));
        } else {
          const uint2 h = *reinterpret_cast<const uint2*>(p.x + at);
          const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&h.x));
          const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&h.y));
          a_reg[i] = make_float4(a.x, a.y, b.x, b.y);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = warp * 16 + lane / 2, col = k0 + (i * 2 + lane % 2) * 4;
      b_reg[i] = zero;
      if (e0 + e < E && col < D)
        b_reg[i] = __ldg(
            reinterpret_cast<const float4*>(p.router + static_cast<size_t>(e0 + e) * D + col));
    }
  };
  load_slice(0);
  for (int k0 = 0; k0 < D; k0 += kTileK) {
    // The rows' slice: 64 x 32 values, 2 float4s a thread; the router's: 128 x 32, 4 a thread.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int t = a_row, c = ((warp / 4 + 2 * i) * 2 + lane % 2) * 4;
      float4 v = a_reg[i];
      if (p.resid) {
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        const float4 g = g_reg[i];
        v = make_float4(v.x * g.x, v.y * g.y, v.z * g.z, v.w * g.w);
      }
      a_s[c][t] = v.x;
      a_s[c + 1][t] = v.y;
      a_s[c + 2][t] = v.z;
      a_s[c + 3][t] = v.w;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = warp * 16 + lane / 2, c = (i * 2 + lane % 2) * 4;
      const float4 w = b_reg[i];
      b_s[c][e] = w.x;
      b_s[c + 1][e] = w.y;
      b_s[c + 2][e] = w.z;
      b_s[c + 3][e] = w.w;
    }
    __syncthreads();
    if (k0 + kTileK < D) load_slice(k0 + kTileK);  // (in flight during the products below)
#pragma unroll 8
    for (int k = 0; k < kTileK; ++k) {
      // (A thread's 8 experts: tx * 4 + 0..3 and 64 + tx * 4 + 0..3, so that a quarter warp's
      // float4s are 128 contiguous bytes.)
      const float4 a = *reinterpret_cast<const float4*>(&a_s[k][ty * 4]);
      const float4 b0 = *reinterpret_cast<const float4*>(&b_s[k][tx * 4]);
      const float4 b1 = *reinterpret_cast<const float4*>(&b_s[k][64 + tx * 4]);
      const float av[4] = {a.x, a.y, a.z, a.w};
      const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] += av[i] * bv[j];
      }
    }
    __syncthreads();
  }
  // Each token's 1/rms: its 4 threads' sums (two neighbouring lanes, in warps w and w + 4) added
  // in a fixed order.
  if (p.resid) {
    const float pair = ss + __shfl_xor_sync(0xffffffffu, ss, 1);
    if (lane % 2 == 0) half_s[warp / 4][a_row] = pair;
    __syncthreads();
    if (tid < kTileTokens)
      inv_s[tid] = rsqrtf((half_s[0][tid] + half_s[1][tid]) / static_cast<float>(D) + p.eps);
  } else if (tid < kTileTokens) {
    inv_s[tid] = 1.0f;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int t = t0 + ty * 4 + i;
    if (t >= T) break;
    const float inv = inv_s[ty * 4 + i];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int e = e0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
      if (e < E) p.logits[static_cast<size_t>(t) * E + e] = acc[i][j] * inv;
    }
  }
  if (p.normed_out && blockIdx.y == 0) {
    const int nt = min(kTileTokens, T - t0);
    for (int x = tid * 4; x < nt * D; x += kTileThreads * 4) {
      const int t = x / D, i = x % D;  // (D a multiple of 4: a float4 stays in its row)
      store_normed4(p, static_cast<size_t>(t0 + t) * D + i, i, inv_s[t]);
    }
  }
}

// Scores and the top k: a warp per token.
__global__ void __launch_bounds__(kTopkThreads) moe_topk_kernel(MoeRouteParams p) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  constexpr int kWarps = kTopkThreads / 32;
  __shared__ float score_s[kWarps][kMoeMaxExperts];
  __shared__ float choice_s[kWarps][kMoeMaxExperts];
  __shared__ float group_s[kWarps][kMoeMaxGroups];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kWarps + warp;
  if (t >= p.num_tokens) return;
  route_token(p, t, score_s[warp], choice_s[warp], group_s[warp], lane);
}

__global__ void __launch_bounds__(kAlignThreads)
    moe_align_kernel(const int32_t* ids, int num_pairs, int E, int capacity, MoeLayout l) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  align_block(ids, num_pairs, E, capacity, l);
}

// ---- The GEMV form: one block per (active expert, rows chunk); each warp one output row (a gate
// row with its up row, or a down row) for all the expert's rows, 8 at a time. When the active
// experts' down weights fit in p.prefetch_limit (decode of one token), the weights stream through
// evict-first loads and gate/up's blocks pull each expert's down weights into L2 meanwhile.
constexpr int kGemvWarps = 4;
constexpr int kGemvGroup = 8;
constexpr int kGemvUnroll = 4;

// kStream: the weights read evict-first and gate/up prefetching the down weights. kRows: output
// rows per warp (down's short rows: one row's few 16-byte pieces a lane leave memory idle between
// a warp's round trips, so a warp takes several rows' pieces at once; gate/up takes one, its gate
// and up rows).
template <bool kGateUp, bool kStream, int kRows>
__global__ void __launch_bounds__(kGemvWarps * 32) moe_gemv_kernel(MoeExpertsParams p) {
  static_assert(!kGateUp || kRows == 1, "gate/up takes a gate row and its up row a warp");
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  const int e = p.layout.active_experts[blockIdx.y];
  if (e < 0) return;
  const int held = held_expert(p, e);  // the expert's weights
  if (held < 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kGemvWarps + warp) * kRows;
  const int F = p.ffn, D = p.dim;
  const int n_out = kGateUp ? F : D, k = kGateUp ? D : F;
  if (kGateUp && kStream && warp == 0) {
    // This block's share of the expert's down weights into L2, read by the next kernel: its
    // loads then hit L2 rather than starting cold while this kernel's stream drains.
    const size_t bytes = static_cast<size_t>(D) * F * sizeof(__nv_bfloat16);
    const size_t share = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
    const size_t begin = blockIdx.x * share;
    if (begin < bytes) {
      internal::prefetch_l2_range(
          reinterpret_cast<const char*>(p.w_down + static_cast<size_t>(held) * D * F) + begin,
          min(share, bytes - begin), lane);
    }
  }
  if (row0 >= n_out) return;
  // The warp's rows (a row past the last reads the last again, and is not written).
  const __nv_bfloat16* w[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = min(row0 + r, n_out - 1);
    w[r] = kGateUp ? p.w_gate_up + (static_cast<size_t>(held) * 2 * F + row) * D
                   : p.w_down + (static_cast<size_t>(held) * D + row) * F;
  }
  const __nv_bfloat16* w1 = kGateUp ? w[0] + static_cast<size_t>(F) * D : nullptr;
  const int start = p.layout.offsets[e], n = p.layout.counts[e];
  for (int g0 = 0; g0 < n; g0 += kGemvGroup) {
    const int ng = min(kGemvGroup, n - g0);
    const __nv_bfloat16* in[kGemvGroup];
    int pair[kGemvGroup];
#pragma unroll
    for (int j = 0; j < kGemvGroup; ++j) {
      pair[j] = j < ng ? p.layout.sorted_pairs[start + g0 + j] : -1;
      in[j] = j >= ng   ? nullptr
              : kGateUp ? p.x + static_cast<size_t>(pair[j] / p.top_k) * D
                        : p.act + static_cast<size_t>(start + g0 + j) * F;
    }
    float a0[kRows][kGemvGroup] = {}, a1[kGemvGroup] = {};
    // kGemvUnroll 16-byte pieces of each weight row in flight per lane before any arithmetic:
    // the weights stream once, so what keeps memory busy is how many loads are outstanding. The
    // group's first row of inputs is loaded with them (the only one at batch 1): loaded in the
    // arithmetic below, each piece would be a round trip to L2 after the weights' arrive. (Not in
    // down's one-row form, whose 72 registers would become 96: 5 blocks an SM instead of 7.)
    constexpr bool kInputAhead = kGateUp || kRows > 1;
    for (int i0 = lane * 8; i0 < k; i0 += 256 * kGemvUnroll) {
      uint4 wa[kRows][kGemvUnroll], wb[kGemvUnroll], x0[kGemvUnroll];
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const int i = i0 + u * 256;
        if (i >= k) break;
          // (Streamed: read once, and kept from pushing the prefetched weights out.)
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          wa[r][u] = kStream ? __ldcs(reinterpret_cast<const uint4*>(w[r] + i))
                             : __ldg(reinterpret_cast<const uint4*>(w[r] + i));
        }
        if (kGateUp)
          wb[u] = kStream ? __ldcs(reinterpret_cast<const uint4*>(w1 + i))
                          : __ldg(reinterpret_cast<const uint4*>(w1 + i));
        if constexpr (kInputAhead) x0[u] = *reinterpret_cast<const uint4*>(in[0] + i);
      }
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const int i = i0 + u * 256;
        if (i >= k) break;
        float fa[kRows][8], fb[8], xv[8];
#pragma unroll
        for (int r = 0; r < kRows; ++r) bf16x8_to_float(wa[r][u], fa[r]);
        if (kGateUp) bf16x8_to_float(wb[u], fb);
#pragma unroll
        for (int j = 0; j < kGemvGroup; ++j) {
          if (j >= ng) break;
          bf16x8_to_float(
              kInputAhead && j == 0 ? x0[u] : *reinterpret_cast<const uint4*>(in[j] + i), xv);
#pragma unroll
          for (int c = 0; c < 8; ++c) {
#pragma unroll
            for (int r = 0; r < kRows; ++r) a0[r][j] += fa[r][c] * xv[c];
            if (kGateUp) a1[j] += fb[c] * xv[c];
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kGemvGroup; ++j) {
      if (j >= ng) break;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = row0 + r;
        const float s0 = warp_sum(a0[r][j]);
        if (kGateUp) {
          const float s1 = warp_sum(a1[j]);
          if (lane == 0)
            p.act[static_cast<size_t>(start + g0 + j) * F + row] =
                __float2bfloat16_rn(silu(s0) * s1);
        } else if (lane == 0 && row < n_out) {
          p.out[static_cast<size_t>(pair[j]) * D + row] = s0 * p.topk_weights[pair[j]];
        }
      }
    }
  }
}

// Down's rows per warp for rows of `k` weights: enough that a lane has about 8-16 pieces in
// flight.
int down_rows_per_warp(int k) { return k <= 1024 ? 4 : k <= 2048 ? 2 : 1; }

template <bool kStream>
cudaError_t launch_down_gemv(const MoeExpertsParams& p, int active, cudaStream_t stream) {
  const dim3 block(kGemvWarps * 32);
  auto grid = [&](int rows) {
    return dim3((p.dim + kGemvWarps * rows - 1) / (kGemvWarps * rows), active);
  };
  switch (down_rows_per_warp(p.ffn)) {
    case 4:
      return internal::launch(moe_gemv_kernel<false, kStream, 4>, grid(4), block, 0, stream, p);
    case 2:
      return internal::launch(moe_gemv_kernel<false, kStream, 2>, grid(2), block, 0, stream, p);
    default:
      return internal::launch(moe_gemv_kernel<false, kStream, 1>, grid(1), block, 0, stream, p);
  }
}

// ---- Down with the combine (MoeExpertsParams::resid_out): a warp per output row, for each token
// in turn its k experts' rows of that output (kCombineExperts of them with their pieces in flight
// at once: a token's 8 experts in Qwen3-30B-A3B are 24 16-byte pieces a lane), each expert's dot
// product summed as the separate down GEMV sums it, then weighted and added in choice order as
// add_rms_norm adds the k rows: the residual comes out as the two kernels leave it, with no `out`
// rows written and read again and no norm kernel of its own.
constexpr int kCombineExperts = 4;

template <bool kStream>
__global__ void __launch_bounds__(kGemvWarps * 32) moe_down_combine_kernel(MoeExpertsParams p) {
  internal::pdl_wait();
  __shared__ float squares_s[kMoeCombineTokens][kGemvWarps];
  const int T = p.num_tokens, K = p.top_k, D = p.dim, F = p.ffn;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int d = blockIdx.x * kGemvWarps + warp;  // the output row
  const bool active = d < D;                     // warp-uniform
  for (int t = 0; t < T; ++t) {
    float sum = 0.0f;  // (lane 0's)
    for (int k0 = 0; active && k0 < K; k0 += kCombineExperts) {
      const int nc = min(kCombineExperts, K - k0);  // (warp-uniform: Mixtral's top 2 is one run)
      const __nv_bfloat16* w[kCombineExperts];
      const __nv_bfloat16* a[kCombineExperts];
#pragma unroll
      for (int c = 0; c < kCombineExperts; ++c) {
        const int pr = t * K + min(k0 + c, K - 1);  // (past the last: not read)
        w[c] = p.w_down + (static_cast<size_t>(p.topk_ids[pr]) * D + d) * F;
        a[c] = p.act + static_cast<size_t>(p.layout.pair_rows[pr]) * F;
      }
      float acc[kCombineExperts] = {};
      for (int i0 = lane * 8; i0 < F; i0 += 256 * kGemvUnroll) {
        uint4 wv[kCombineExperts][kGemvUnroll];
#pragma unroll
        for (int u = 0; u < kGemvUnroll; ++u) {
          const int i = i0 + u * 256;
          if (i >= F) break;
#pragma unroll
          for (int c = 0; c < kCombineExperts; ++c) {
            if (c >= nc) break;
            wv[c][u] = kStream ? __ldcs(reinterpret_cast<const uint4*>(w[c] + i))
                               : __ldg(reinterpret_cast<const uint4*>(w[c] + i));
          }
        }
#pragma unroll
        for (int u = 0; u < kGemvUnroll; ++u) {
          const int i = i0 + u * 256;
          if (i >= F) break;
#pragma unroll
          for (int c = 0; c < kCombineExperts; ++c) {
            if (c >= nc) break;
            float fw[8], xv[8];
            bf16x8_to_float(wv[c][u], fw);
            bf16x8_to_float(*reinterpret_cast<const uint4*>(a[c] + i), xv);
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[c] += fw[j] * xv[j];
          }
        }
      }
#pragma unroll
      for (int c = 0; c < kCombineExperts; ++c) {
        if (c >= nc) break;
        const float s = warp_sum(acc[c]);
        // (Rounded as the separate kernel stores it, then summed as add_rms_norm sums the rows.)
        const float out = __fmul_rn(s, p.topk_weights[t * K + k0 + c]);
        sum = k0 + c == 0 ? out : sum + out;
      }
    }
    if (lane == 0) {
      float r = 0.0f;
      if (active) {
        const size_t at = static_cast<size_t>(t) * D + d;
        r = p.resid_in[at] + sum;
        p.resid_out[at] = r;
      }
      squares_s[t][warp] = r * r;
    }
  }
  // (The next kernel let in only now: it would otherwise prefetch into this one's stream.)
  internal::pdl_launch_dependents();
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < T) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kGemvWarps; ++w) total += squares_s[threadIdx.x][w];
    atomicAdd(p.out_sumsq + threadIdx.x, total);
  }
}

// ---- The grouped-GEMM form: a block per (tile of kMoeTile sorted rows, a shape's kN output
// columns), its warps laid over the tile kWarpsM down and kWarpsN across, mma.sync m16n8k16 over
// k-slices of kGemmK staged by cp.async kStages deep (all but one slice in flight while one is
// multiplied), A's rows gathered from their tokens as they load, both operands' fragments
// through ldmatrix. gate/up keeps two accumulators (the gate columns and their up columns) and
// writes SwiGLU's activation; down writes each row's output times its pair's weight.
//
// Two shapes (MoeKernel): warps of 32 rows x 32 columns of each weight tile (eight a block, 128
// columns, three stages), and warps of all 64 rows x 64 weight columns (gate/up: 32 gate and
// their 32 up; four a block, four stages), which load fewer fragments per product (four
// ldmatrix for 32 mma.sync against two for eight at down's 32 x 32) and wait at fewer barriers
// per product.
constexpr int kGemmK = 32;
constexpr int kGemmLd = kGemmK + 8;  // bf16 row stride: 16-byte rows, conflict-free ldmatrix

template <bool kGateUp, bool kWide>
struct GemmShape {
  static constexpr int kB = kGateUp ? 2 : 1;  // weight tiles a stage: gate and up, or down
  static constexpr int kWarpRows = kWide ? kMoeTile : 32;
  static constexpr int kWarpCols = kWide ? 64 / kB : 32;  // a warp's columns of each weight tile
  static constexpr int kWarpsM = kMoeTile / kWarpRows;
  static constexpr int kWarpsN = 4;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kN = kWarpsN * kWarpCols;  // output columns a block
  static constexpr int kStages = kWide ? 4 : 3;
  static constexpr int kMt = kWarpRows / 16;  // a warp's 16-row fragments
  static constexpr int kNt = kWarpCols / 8;   // ... and 8-column ones of each weight tile
  static constexpr size_t kStageElems = static_cast<size_t>(kMoeTile + kB * kN) * kGemmLd;
  static constexpr size_t kSmemBytes = sizeof(__nv_bfloat16) * kStages * kStageElems;
};

template <bool kGateUp, bool kWide>
__global__ void __launch_bounds__((GemmShape<kGateUp, kWide>::kThreads))
    moe_gemm_kernel(MoeExpertsParams p) {
  using S = GemmShape<kGateUp, kWide>;
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  constexpr int kB = S::kB;
  constexpr int kChunks = kGemmK / 8;  // 16-byte pieces per row of a slice
  // Stage s at smem + s * kStageElems: its A tile, then its weight tiles.
  HR_DYNAMIC_SMEM(__nv_bfloat16, smem, 128);
  // Each row's pair (-1: padding) and, for gate/up, its token (its row of x).
  __shared__ int pair_s[kMoeTile], token_s[kMoeTile];
  const int tile = blockIdx.y;
  const int e = p.layout.tile_experts[tile];
  if (e < 0) return;
  const int held = held_expert(p, e);  // the expert's weights
  if (held < 0) return;
  const int F = p.ffn, D = p.dim;
  const int N = kGateUp ? F : D, K = kGateUp ? D : F;
  const int row0 = tile * kMoeTile, n0 = blockIdx.x * S::kN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = (warp / S::kWarpsN) * S::kWarpRows, wn = (warp % S::kWarpsN) * S::kWarpCols;
  stage_tile_rows<kGateUp>(p, row0, pair_s, token_s);
  const __nv_bfloat16* wbase = expert_weights<kGateUp>(p, held);
  const __nv_bfloat16* abase = kGateUp ? p.x : p.act;
  auto a_tile = [&](int s) { return smem + s * S::kStageElems; };
  auto b_tile = [&](int s, int b) {
    return smem + s * S::kStageElems + (kMoeTile + b * S::kN) * kGemmLd;
  };

  // One k-slice into stage s, as one copy group (empty past the last slice).
  auto load = [&](int s, int k0) {
    if (k0 < K) {
      for (int c = threadIdx.x; c < kMoeTile * kChunks; c += S::kThreads) {
        const int r = c / kChunks, kc = k0 + (c % kChunks) * 8;
        const int src = tile_a_row<kGateUp>(pair_s, token_s, row0, r);
        const bool valid = src >= 0 && kc < K;
        internal::cp_async16(a_tile(s) + r * kGemmLd + (c % kChunks) * 8,
                             valid ? abase + static_cast<size_t>(src) * K + kc : wbase, valid);
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        for (int c = threadIdx.x; c < S::kN * kChunks; c += S::kThreads) {
          const int n = n0 + c / kChunks, kc = k0 + (c % kChunks) * 8;
          const bool valid = n < N && kc < K;
          const __nv_bfloat16* src =
              valid ? wbase + (static_cast<size_t>(b) * F + n) * K + kc : wbase;
          internal::cp_async16(b_tile(s, b) + (c / kChunks) * kGemmLd + (c % kChunks) * 8, src,
                               valid);
        }
      }
    }
    internal::cp_async_commit();
  };

  float acc[kB][S::kMt][S::kNt][4] = {};
  const int slices = (K + kGemmK - 1) / kGemmK;
  for (int s = 0; s < S::kStages - 1; ++s) load(s, s * kGemmK);
  for (int ks = 0; ks < slices; ++ks) {
    internal::cp_async_wait<S::kStages - 2>();  // slice ks has landed
    __syncthreads();  // ... for every thread; and the stage loaded next was read by all
    load((ks + S::kStages - 1) % S::kStages, (ks + S::kStages - 1) * kGemmK);
    const int s = ks % S::kStages;
#pragma unroll
    for (int kk = 0; kk < kGemmK; kk += 16) {
      uint32_t a[S::kMt][4];
#pragma unroll
      for (int m = 0; m < S::kMt; ++m) {
        internal::ldmatrix_x4(
            a[m], a_tile(s) + (wm + m * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kGemmLd + kk +
                      (lane / 16) * 8);
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
#pragma unroll
        for (int np = 0; np < S::kNt / 2; ++np) {
          // Two 8-column tiles: b0, b1 of the first, then of the second.
          uint32_t bf[4];
          internal::ldmatrix_x4(bf, b_tile(s, b) +
                                        (wn + np * 16 + (lane % 8) + (lane / 16) * 8) * kGemmLd +
                                        kk + ((lane / 8) % 2) * 8);
#pragma unroll
          for (int m = 0; m < S::kMt; ++m) {
            internal::mma16816(acc[b][m][2 * np], a[m], bf[0], bf[1]);
            internal::mma16816(acc[b][m][2 * np + 1], a[m], bf[2], bf[3]);
          }
        }
      }
    }
  }
  internal::cp_async_wait<0>();  // (only empty groups are left)

  // Each lane holds rows lane / 4 and lane / 4 + 8 of each 16-row tile, columns (lane % 4) * 2
  // and + 1 of each 8-wide tile: a pair of columns stored at once (N is even, as is col).
#pragma unroll
  for (int m = 0; m < S::kMt; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm + m * 16 + lane / 4 + half * 8;
      const int pair = pair_s[r];
      if (pair < 0) continue;
      const float weight = kGateUp ? 0.0f : p.topk_weights[pair];
#pragma unroll
      for (int n = 0; n < S::kNt; ++n) {
        const int col = n0 + wn + n * 8 + (lane % 4) * 2;
        if (col >= N) continue;
        store_column_pair<kGateUp>(p, row0 + r, pair, weight, col, acc[0][m][n][half * 2],
                                   acc[0][m][n][half * 2 + 1], acc[kB - 1][m][n][half * 2],
                                   acc[kB - 1][m][n][half * 2 + 1]);
      }
    }
  }
}

// gate/up, then down, over the sorted tiles.
template <bool kWide>
cudaError_t launch_grouped_gemm(const MoeExpertsParams& p, cudaStream_t stream) {
  using GateUp = GemmShape<true, kWide>;
  using Down = GemmShape<false, kWide>;
  return internal::launch_gate_up_then_down<moe_gemm_kernel<true, kWide>,
                                            moe_gemm_kernel<false, kWide>>(
      p, {GateUp::kN, GateUp::kThreads, GateUp::kSmemBytes},
      {Down::kN, Down::kThreads, Down::kSmemBytes}, stream);
}

}  // namespace

cudaError_t moe_route(const MoeRouteParams& p, cudaStream_t stream) {
  const MoeRouting& r = p.routing;
  if (p.num_tokens < 0 || p.dim <= 0 || p.dim % 4 != 0 || r.num_experts < 1 ||
      r.num_experts > kMoeMaxExperts || r.top_k < 1 || r.top_k > kMoeMaxTopK ||
      r.top_k > r.num_experts || (!p.x && !p.resid) || (p.resid && !p.norm_weight) ||
      (p.normed_out && !p.resid) || !p.router || !p.topk_ids || !p.topk_weights) {
    return cudaErrorInvalidValue;
  }
  if (r.num_groups > 1 &&
      (!r.sigmoid || r.num_groups > kMoeMaxGroups || r.num_experts % r.num_groups != 0 ||
       r.topk_groups < 1 || r.topk_groups > r.num_groups)) {
    return cudaErrorInvalidValue;
  }
  const bool sorting = p.layout.counts != nullptr;
  if (sorting && (!p.counter || p.capacity < moe_capacity(p.num_tokens * r.top_k, r.num_experts) ||
                  p.capacity % kMoeTile != 0 || !p.layout.offsets || !p.layout.sorted_pairs ||
                  !p.layout.pair_rows || !p.layout.tile_experts || !p.layout.active_experts)) {
    return cudaErrorInvalidValue;
  }
  if (p.num_tokens == 0) {
    return sorting ? moe_align(p.topk_ids, 0, r.num_experts, p.capacity, p.layout, stream)
                   : cudaSuccess;
  }
  const int token_blocks = (p.num_tokens + kRouteTokens - 1) / kRouteTokens;
  const int per_block = kRouteWarps / route_warps_per_expert(r.num_experts, p.num_tokens);
  const dim3 grid((r.num_experts + per_block - 1) / per_block, token_blocks);
  if (sorting && token_blocks == 1)
    return internal::launch(moe_logits_kernel<true>, grid, dim3(kRouteThreads), 0, stream, p);
  cudaError_t err;
  if (p.tiled && p.num_tokens > kRouteTokens) {
    const dim3 tiles((p.num_tokens + kTileTokens - 1) / kTileTokens,
                     (r.num_experts + kTileExperts - 1) / kTileExperts);
    err = internal::launch(moe_logits_tiled_kernel, tiles, dim3(kTileThreads), 0, stream, p);
  } else {
    err = internal::launch(moe_logits_kernel<false>, grid, dim3(kRouteThreads), 0, stream, p);
  }
  if (err != cudaSuccess) return err;
  err = internal::launch(moe_topk_kernel,
                         dim3((p.num_tokens + kTopkThreads / 32 - 1) / (kTopkThreads / 32)),
                         dim3(kTopkThreads), 0, stream, p);
  if (err != cudaSuccess || !sorting) return err;
  return moe_align(p.topk_ids, p.num_tokens * r.top_k, r.num_experts, p.capacity, p.layout, stream);
}

cudaError_t moe_align(const int32_t* topk_ids, int num_pairs, int num_experts, int capacity,
                      const MoeLayout& l, cudaStream_t stream) {
  if (num_pairs < 0 || num_experts < 1 || num_experts > kMoeMaxExperts ||
      capacity < moe_capacity(num_pairs, num_experts) || capacity % kMoeTile != 0 || !topk_ids ||
      !l.counts || !l.offsets || !l.sorted_pairs || !l.tile_experts || !l.active_experts ||
      !l.pair_rows) {
    return cudaErrorInvalidValue;
  }
  return internal::launch(moe_align_kernel, dim3(1), dim3(kAlignThreads), 0, stream, topk_ids,
                          num_pairs, num_experts, capacity, l);
}

cudaError_t moe_experts(const MoeExpertsParams& p, MoeKernel kernel, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.top_k < 1 || p.num_experts < 1 || p.dim <= 0 || p.ffn <= 0 ||
      p.dim % 8 != 0 || p.ffn % 8 != 0 || !p.x || !p.w_gate_up || !p.w_down || !p.topk_weights ||
      !p.act || (!p.out && !p.resid_out) ||
      p.capacity < moe_capacity(p.num_tokens * p.top_k, p.num_experts) || p.first_expert < 0 ||
      p.num_local_experts < 0 || p.first_expert + p.num_local_experts > p.num_experts) {
    return cudaErrorInvalidValue;
  }
  if (p.resid_out &&
      (kernel != MoeKernel::kGemv || p.num_tokens > kMoeCombineTokens || p.top_k > kMoeMaxTopK ||
       p.num_local_experts != 0 || !p.topk_ids || !p.layout.pair_rows || !p.resid_in ||
       !p.out_sumsq || p.resid_in == p.resid_out)) {
    return cudaErrorInvalidValue;
  }
  if (!internal::aligned16(p.x) || !internal::aligned16(p.w_gate_up) ||
      !internal::aligned16(p.w_down) || !internal::aligned16(p.act)) {
    return cudaErrorInvalidValue;
  }
  if (p.num_tokens == 0) return cudaSuccess;
  cudaError_t err;
  if (kernel == MoeKernel::kGemv) {
    // Experts with pairs are at most the pairs.
    const int active = std::min(p.num_experts, p.num_tokens * p.top_k);
    const bool stream_weights =
        static_cast<size_t>(active) * p.dim * p.ffn * sizeof(__nv_bfloat16) <= p.prefetch_limit;
    const dim3 gate_up_grid((p.ffn + kGemvWarps - 1) / kGemvWarps, active);
    const dim3 block(kGemvWarps * 32);
    err =
        stream_weights
            ? internal::launch(moe_gemv_kernel<true, true, 1>, gate_up_grid, block, 0, stream, p)
            : internal::launch(moe_gemv_kernel<true, false, 1>, gate_up_grid, block, 0, stream, p);
    if (err != cudaSuccess) return err;
    if (p.resid_out) {
      const dim3 rows((p.dim + kGemvWarps - 1) / kGemvWarps);
      return stream_weights
                 ? internal::launch(moe_down_combine_kernel<true>, rows, block, 0, stream, p)
                 : internal::launch(moe_down_combine_kernel<false>, rows, block, 0, stream, p);
    }
    return stream_weights ? launch_down_gemv<true>(p, active, stream)
                          : launch_down_gemv<false>(p, active, stream);
  }
  if (kernel == MoeKernel::kGroupedGemmWarpgroup)
    return internal::moe_grouped_gemm_wgmma(p, stream);
  return kernel == MoeKernel::kGroupedGemmWide ? launch_grouped_gemm<true>(p, stream)
                                               : launch_grouped_gemm<false>(p, stream);
}

}  // namespace hr::kernels
