// Mixture-of-experts kernels (moe.cuh): routing, the sorted layout, and the experts' GEMV and
// grouped-GEMM forms.
#include <algorithm>

#include "kernels/internal/common.cuh"
#include "kernels/internal/mma.cuh"
#include "kernels/moe.cuh"

namespace hr::kernels {
namespace {

using internal::bf16x8_to_float;
using internal::warp_max;
using internal::warp_sum;

constexpr int kRouteTokens = 8;  // tokens per routing block: each router row read once for them
constexpr int kRouteThreads = 256;

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

// Router logits: a block per (8 experts, kRouteTokens tokens), a warp per expert for all the
// block's tokens (the router row read once for them), many blocks even for one token. Of the
// residual-stream form, the dot with resid * norm_weight: the 1/rms factor is the top-k kernel's.
__global__ void __launch_bounds__(kRouteThreads) moe_logits_kernel(MoeRouteParams p) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  const int E = p.routing.num_experts, D = p.dim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = blockIdx.x * (kRouteThreads / 32) + warp;
  const int t0 = blockIdx.y * kRouteTokens;
  const int nt = min(kRouteTokens, p.num_tokens - t0);
  if (e >= E) return;
  float acc[kRouteTokens] = {};
  const float* w = p.router + static_cast<size_t>(e) * D;
  for (int i = lane * 4; i < D; i += 128) {
    float4 wv = *reinterpret_cast<const float4*>(w + i);
    if (p.resid) {
      const float4 g = *reinterpret_cast<const float4*>(p.norm_weight + i);
      wv = make_float4(wv.x * g.x, wv.y * g.y, wv.z * g.z, wv.w * g.w);
    }
#pragma unroll
    for (int t = 0; t < kRouteTokens; ++t) {
      if (t >= nt) break;
      float4 xv;
      if (p.resid) {
        xv = *reinterpret_cast<const float4*>(p.resid + static_cast<size_t>(t0 + t) * D + i);
      } else {
        const __nv_bfloat162* h =
            reinterpret_cast<const __nv_bfloat162*>(p.x + static_cast<size_t>(t0 + t) * D + i);
        const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
        xv = make_float4(a.x, a.y, b.x, b.y);
      }
      acc[t] += xv.x * wv.x + xv.y * wv.y + xv.z * wv.z + xv.w * wv.w;
    }
  }
#pragma unroll
  for (int t = 0; t < kRouteTokens; ++t) {
    if (t >= nt) break;
    const float s = warp_sum(acc[t]);
    if (lane == 0) p.logits[static_cast<size_t>(t0 + t) * E + e] = s;
  }
}

// Scores and the top k: a warp per token (kRouteTokens a block).
__global__ void __launch_bounds__(kRouteThreads) moe_topk_kernel(MoeRouteParams p) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  __shared__ float score_s[kRouteTokens][kMoeMaxExperts];
  __shared__ float choice_s[kRouteTokens][kMoeMaxExperts];
  __shared__ float group_s[kRouteTokens][kMoeMaxGroups];
  const MoeRouting& r = p.routing;
  const int E = r.num_experts, K = r.top_k, D = p.dim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t0 = blockIdx.x * kRouteTokens;
  if (t0 + warp >= p.num_tokens) return;
  const int t = warp;
  float* score = score_s[t];
  float* choice = choice_s[t];
  float inv_rms = 1.0f;
  if (p.resid) {
    const float* row = p.resid + static_cast<size_t>(t0 + t) * D;
    float ss = 0;
    for (int i = lane; i < D; i += 32) ss += row[i] * row[i];
    inv_rms = rsqrtf(warp_sum(ss) / static_cast<float>(D) + p.eps);
  }
  for (int e = lane; e < E; e += 32)
    score[e] = p.logits[static_cast<size_t>(t0 + t) * E + e] * inv_rms;
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
      group_s[t][lane] = per > 1 ? a + b : a;
    }
    __syncwarp();
    kept_groups = 0;
    for (int j = 0; j < r.topk_groups; ++j) {
      const int g =
          warp_best(group_s[t], G, lane, [&](int g) { return ((kept_groups >> g) & 1u) == 0; });
      if (g >= 0) kept_groups |= 1u << g;
    }
  }
  // The top k, one warp-wide argmax each; then the weights from the unbiased scores.
  int ids[kMoeMaxTopK];
  uint32_t taken[kMoeMaxExperts / 32] = {};
  float total = 0;
  for (int j = 0; j < K; ++j) {
    const int e = warp_best(choice, E, lane, [&](int e) {
      return ((taken[e / 32] >> (e % 32)) & 1u) == 0 && ((kept_groups >> (e / per)) & 1u) != 0;
    });
    ids[j] = e;
    if (e >= 0) {
      taken[e / 32] |= 1u << (e % 32);
      total += score[e];
    }
  }
  if (lane == 0) {
    const size_t base = static_cast<size_t>(t0 + t) * K;
    for (int j = 0; j < K; ++j) {
      float w = ids[j] >= 0 ? score[ids[j]] : 0.0f;
      if (r.renormalize) w /= total;
      p.topk_ids[base + j] = ids[j] >= 0 ? ids[j] : 0;
      p.topk_weights[base + j] = w * r.scaling;
    }
  }
}

constexpr int kAlignThreads = 1024;

__global__ void __launch_bounds__(kAlignThreads)
    moe_align_kernel(const int32_t* ids, int num_pairs, int E, int capacity, MoeLayout l) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  __shared__ int count_s[kMoeMaxExperts];
  __shared__ int cursor_s[kMoeMaxExperts];
  __shared__ int offset_s[kMoeMaxExperts + 1];
  for (int x = threadIdx.x; x < E; x += blockDim.x) count_s[x] = cursor_s[x] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < num_pairs; i += blockDim.x) atomicAdd(&count_s[ids[i]], 1);
  __syncthreads();
  // Exclusive scans over the experts (thread e for expert e): the padded offsets, and each active
  // expert's place in the list.
  __shared__ int warp_rows_s[kAlignThreads / 32], warp_active_s[kAlignThreads / 32];
  __shared__ int num_active_s;
  const int e = threadIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int count = e < E ? count_s[e] : 0;
  const int rows = (count + kMoeTile - 1) / kMoeTile * kMoeTile, active = count > 0 ? 1 : 0;
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
  int rows_before = 0, active_before = 0;
  for (int w = 0; w < warp; ++w) {
    rows_before += warp_rows_s[w];
    active_before += warp_active_s[w];
  }
  if (e < E) {
    offset_s[e] = rows_before + rows_incl - rows;
    if (active) l.active_experts[active_before + active_incl - 1] = e;
  }
  if (e == E - 1) {
    offset_s[E] = rows_before + rows_incl;
    num_active_s = active_before + active_incl;
  }
  __syncthreads();
  for (int i = num_active_s + threadIdx.x; i < E; i += blockDim.x) l.active_experts[i] = -1;
  for (int x = threadIdx.x; x <= E; x += blockDim.x) {
    l.offsets[x] = offset_s[x];
    if (x < E) l.counts[x] = count_s[x];
  }
  for (int i = threadIdx.x; i < capacity; i += blockDim.x) l.sorted_pairs[i] = -1;
  for (int tile = threadIdx.x; tile < capacity / kMoeTile; tile += blockDim.x) {
    const int row = tile * kMoeTile;
    int lo = 0, hi = E;  // the expert whose rows hold `row`: offset_s[lo] <= row < offset_s[lo + 1]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (offset_s[mid] <= row)
        lo = mid;
      else
        hi = mid;
    }
    l.tile_experts[tile] = row < offset_s[E] ? lo : -1;
  }
  __syncthreads();  // the padding's -1 lands before the pairs
  for (int i = threadIdx.x; i < num_pairs; i += blockDim.x) {
    const int x = ids[i];
    l.sorted_pairs[offset_s[x] + atomicAdd(&cursor_s[x], 1)] = i;
  }
}

// ---- The GEMV form: one block per (active expert, rows chunk); each warp one output row (a gate
// row with its up row, or a down row) for all the expert's rows, 8 at a time.
constexpr int kGemvWarps = 4;
constexpr int kGemvGroup = 8;
constexpr int kGemvUnroll = 4;

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

template <bool kGateUp>
__global__ void __launch_bounds__(kGemvWarps * 32) moe_gemv_kernel(MoeExpertsParams p) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  const int e = p.layout.active_experts[blockIdx.y];
  if (e < 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kGemvWarps + warp;
  const int F = p.ffn, D = p.dim;
  const int n_out = kGateUp ? F : D, k = kGateUp ? D : F;
  if (row >= n_out) return;
  const __nv_bfloat16* w0 = kGateUp ? p.w_gate_up + (static_cast<size_t>(e) * 2 * F + row) * D
                                    : p.w_down + (static_cast<size_t>(e) * D + row) * F;
  const __nv_bfloat16* w1 = kGateUp ? w0 + static_cast<size_t>(F) * D : nullptr;
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
    float a0[kGemvGroup] = {}, a1[kGemvGroup] = {};
    // kGemvUnroll 16-byte pieces of each weight row in flight per lane before any arithmetic:
    // the weights stream once, so what keeps memory busy is how many loads are outstanding.
    for (int i0 = lane * 8; i0 < k; i0 += 256 * kGemvUnroll) {
      uint4 wa[kGemvUnroll], wb[kGemvUnroll];
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const int i = i0 + u * 256;
        if (i >= k) break;
        wa[u] = __ldg(reinterpret_cast<const uint4*>(w0 + i));
        if (kGateUp) wb[u] = __ldg(reinterpret_cast<const uint4*>(w1 + i));
      }
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const int i = i0 + u * 256;
        if (i >= k) break;
        float fa[8], fb[8], xv[8];
        bf16x8_to_float(wa[u], fa);
        if (kGateUp) bf16x8_to_float(wb[u], fb);
#pragma unroll
        for (int j = 0; j < kGemvGroup; ++j) {
          if (j >= ng) break;
          bf16x8_to_float(*reinterpret_cast<const uint4*>(in[j] + i), xv);
#pragma unroll
          for (int c = 0; c < 8; ++c) {
            a0[j] += fa[c] * xv[c];
            if (kGateUp) a1[j] += fb[c] * xv[c];
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kGemvGroup; ++j) {
      if (j >= ng) break;
      const float s0 = warp_sum(a0[j]);
      if (kGateUp) {
        const float s1 = warp_sum(a1[j]);
        if (lane == 0)
          p.act[static_cast<size_t>(start + g0 + j) * F + row] = __float2bfloat16_rn(silu(s0) * s1);
      } else if (lane == 0) {
        p.out[static_cast<size_t>(pair[j]) * D + row] = s0 * p.topk_weights[pair[j]];
      }
    }
  }
}

// ---- The grouped-GEMM form: a block per (tile of kMoeTile sorted rows, kGemmN output columns),
// eight warps of 32 x 32 (two down the tile, four across), mma.sync m16n8k16 over k-slices of 32
// staged by cp.async three deep (two slices in flight while one is multiplied), A's rows gathered
// from their tokens as they load, both operands' fragments through ldmatrix. gate/up keeps two
// accumulators (the gate columns and their up columns) and writes SwiGLU's activation; down
// writes each row's output times its pair's weight.
constexpr int kGemmN = 128;
constexpr int kGemmK = 32;
constexpr int kGemmLd = kGemmK + 8;  // bf16 row stride: 16-byte rows, conflict-free ldmatrix
constexpr int kGemmThreads = 256;
constexpr int kGemmStages = 3;

constexpr size_t gemm_stage_elems(bool gate_up) {
  return static_cast<size_t>(kMoeTile + (gate_up ? 2 : 1) * kGemmN) * kGemmLd;
}
constexpr size_t gemm_smem_bytes(bool gate_up) {
  return sizeof(__nv_bfloat16) * kGemmStages * gemm_stage_elems(gate_up);
}

template <bool kGateUp>
__global__ void __launch_bounds__(kGemmThreads) moe_gemm_kernel(MoeExpertsParams p) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  constexpr int kB = kGateUp ? 2 : 1;  // weight tiles per stage
  constexpr int kChunks = kGemmK / 8;  // 16-byte pieces per row of a slice
  // Stage s at smem + s * gemm_stage_elems: its A tile, then its weight tiles.
  HR_DYNAMIC_SMEM(__nv_bfloat16, smem, 128);
  __shared__ int pair_s[kMoeTile];
  const int tile = blockIdx.y;
  const int e = p.layout.tile_experts[tile];
  if (e < 0) return;
  const int F = p.ffn, D = p.dim;
  const int N = kGateUp ? F : D, K = kGateUp ? D : F;
  const int row0 = tile * kMoeTile, n0 = blockIdx.x * kGemmN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = (warp / 4) * 32, wn = (warp % 4) * 32;
  for (int r = threadIdx.x; r < kMoeTile; r += kGemmThreads)
    pair_s[r] = p.layout.sorted_pairs[row0 + r];
  __syncthreads();
  const __nv_bfloat16* wbase = kGateUp ? p.w_gate_up + static_cast<size_t>(e) * 2 * F * D
                                       : p.w_down + static_cast<size_t>(e) * D * F;
  auto a_tile = [&](int s) { return smem + s * gemm_stage_elems(kGateUp); };
  auto b_tile = [&](int s, int b) {
    return smem + s * gemm_stage_elems(kGateUp) + (kMoeTile + b * kGemmN) * kGemmLd;
  };

  // One k-slice into stage s, as one copy group (empty past the last slice).
  auto load = [&](int s, int k0) {
    if (k0 < K) {
      for (int c = threadIdx.x; c < kMoeTile * kChunks; c += kGemmThreads) {
        const int r = c / kChunks, kc = k0 + (c % kChunks) * 8;
        const int pair = pair_s[r];
        const bool valid = pair >= 0 && kc < K;
        const __nv_bfloat16* src = !valid    ? wbase
                                   : kGateUp ? p.x + static_cast<size_t>(pair / p.top_k) * D + kc
                                             : p.act + static_cast<size_t>(row0 + r) * F + kc;
        internal::cp_async16(a_tile(s) + r * kGemmLd + (c % kChunks) * 8, src, valid);
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        for (int c = threadIdx.x; c < kGemmN * kChunks; c += kGemmThreads) {
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

  float acc[kB][2][4][4] = {};
  const int slices = (K + kGemmK - 1) / kGemmK;
  for (int s = 0; s < kGemmStages - 1; ++s) load(s, s * kGemmK);
  for (int ks = 0; ks < slices; ++ks) {
    internal::cp_async_wait<kGemmStages - 2>();  // slice ks has landed
    __syncthreads();  // ... for every thread; and the stage loaded next was read by all
    load((ks + kGemmStages - 1) % kGemmStages, (ks + kGemmStages - 1) * kGemmK);
    const int s = ks % kGemmStages;
#pragma unroll
    for (int kk = 0; kk < kGemmK; kk += 16) {
      uint32_t a[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        internal::ldmatrix_x4(
            a[m], a_tile(s) + (wm + m * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kGemmLd + kk +
                      (lane / 16) * 8);
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          // Two 8-column tiles: b0, b1 of the first, then of the second.
          uint32_t bf[4];
          internal::ldmatrix_x4(bf, b_tile(s, b) +
                                        (wn + np * 16 + (lane % 8) + (lane / 16) * 8) * kGemmLd +
                                        kk + ((lane / 8) % 2) * 8);
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            internal::mma16816(acc[b][m][2 * np], a[m], bf[0], bf[1]);
            internal::mma16816(acc[b][m][2 * np + 1], a[m], bf[2], bf[3]);
          }
        }
      }
    }
  }
  internal::cp_async_wait<0>();  // (only empty groups are left)

  // Each lane holds rows lane / 4 and lane / 4 + 8 of each 16-row tile, columns (lane % 4) * 2
  // and + 1 of each 8-wide tile.
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm + m * 16 + lane / 4 + half * 8;
      const int pair = pair_s[r];
      if (pair < 0) continue;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int col = n0 + wn + n * 8 + (lane % 4) * 2;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (col + c >= N) continue;
          const float v = acc[0][m][n][half * 2 + c];
          if (kGateUp) {
            const float u = acc[kB - 1][m][n][half * 2 + c];
            p.act[static_cast<size_t>(row0 + r) * F + col + c] = __float2bfloat16_rn(silu(v) * u);
          } else {
            p.out[static_cast<size_t>(pair) * D + col + c] = v * p.topk_weights[pair];
          }
        }
      }
    }
  }
}

// Shared memory past 48 KiB is asked for once per process (the kernels run on one device each).
template <bool kGateUp>
cudaError_t gemm_smem_once() {
  static std::atomic<int> done{0};
  if (done.load(std::memory_order_acquire)) return cudaSuccess;
  const cudaError_t err =
      cudaFuncSetAttribute(moe_gemm_kernel<kGateUp>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(gemm_smem_bytes(kGateUp)));
  if (err == cudaSuccess) done.store(1, std::memory_order_release);
  return err;
}

}  // namespace

cudaError_t moe_route(const MoeRouteParams& p, cudaStream_t stream) {
  const MoeRouting& r = p.routing;
  if (p.num_tokens < 0 || p.dim <= 0 || p.dim % 4 != 0 || r.num_experts < 1 ||
      r.num_experts > kMoeMaxExperts || r.top_k < 1 || r.top_k > kMoeMaxTopK ||
      r.top_k > r.num_experts || (!p.x && !p.resid) || (p.resid && !p.norm_weight) || !p.router ||
      !p.topk_ids || !p.topk_weights) {
    return cudaErrorInvalidValue;
  }
  if (r.num_groups > 1 &&
      (!r.sigmoid || r.num_groups > kMoeMaxGroups || r.num_experts % r.num_groups != 0 ||
       r.topk_groups < 1 || r.topk_groups > r.num_groups)) {
    return cudaErrorInvalidValue;
  }
  if (p.num_tokens == 0) return cudaSuccess;
  const int token_blocks = (p.num_tokens + kRouteTokens - 1) / kRouteTokens;
  const int expert_blocks = (r.num_experts + kRouteThreads / 32 - 1) / (kRouteThreads / 32);
  cudaError_t err = internal::launch(moe_logits_kernel, dim3(expert_blocks, token_blocks),
                                     dim3(kRouteThreads), 0, stream, p);
  if (err != cudaSuccess) return err;
  return internal::launch(moe_topk_kernel, dim3(token_blocks), dim3(kRouteThreads), 0, stream, p);
}

cudaError_t moe_align(const int32_t* topk_ids, int num_pairs, int num_experts, int capacity,
                      const MoeLayout& l, cudaStream_t stream) {
  if (num_pairs < 0 || num_experts < 1 || num_experts > kMoeMaxExperts ||
      capacity < moe_capacity(num_pairs, num_experts) || capacity % kMoeTile != 0 || !topk_ids ||
      !l.counts || !l.offsets || !l.sorted_pairs || !l.tile_experts || !l.active_experts) {
    return cudaErrorInvalidValue;
  }
  return internal::launch(moe_align_kernel, dim3(1), dim3(kAlignThreads), 0, stream, topk_ids,
                          num_pairs, num_experts, capacity, l);
}

cudaError_t moe_experts(const MoeExpertsParams& p, MoeKernel kernel, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.top_k < 1 || p.num_experts < 1 || p.dim <= 0 || p.ffn <= 0 ||
      p.dim % 8 != 0 || p.ffn % 8 != 0 || !p.x || !p.w_gate_up || !p.w_down || !p.topk_weights ||
      !p.act || !p.out || p.capacity < moe_capacity(p.num_tokens * p.top_k, p.num_experts)) {
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
    err =
        internal::launch(moe_gemv_kernel<true>, dim3((p.ffn + kGemvWarps - 1) / kGemvWarps, active),
                         dim3(kGemvWarps * 32), 0, stream, p);
    if (err != cudaSuccess) return err;
    return internal::launch(moe_gemv_kernel<false>,
                            dim3((p.dim + kGemvWarps - 1) / kGemvWarps, active),
                            dim3(kGemvWarps * 32), 0, stream, p);
  }
  const int tiles = p.capacity / kMoeTile;
  if ((err = gemm_smem_once<true>()) != cudaSuccess ||
      (err = gemm_smem_once<false>()) != cudaSuccess)
    return err;
  err = internal::launch(moe_gemm_kernel<true>, dim3((p.ffn + kGemmN - 1) / kGemmN, tiles),
                         dim3(kGemmThreads), gemm_smem_bytes(true), stream, p);
  if (err != cudaSuccess) return err;
  return internal::launch(moe_gemm_kernel<false>, dim3((p.dim + kGemmN - 1) / kGemmN, tiles),
                          dim3(kGemmThreads), gemm_smem_bytes(false), stream, p);
}

}  // namespace hr::kernels
