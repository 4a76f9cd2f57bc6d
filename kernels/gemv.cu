// GEMV for few rows: one warp per output column n; each lane streams 16-byte pieces of w's row n
// (eight in flight, marked evict-first) and multiplies them with the matching pieces of every input
// row (small, cached). Under programmatic launch, the first two pieces of each lane are prefetched
// into L2 before waiting for the previous kernel (a few MB: about what the memory system moves
// while that kernel drains), and the next kernel is let in only when the last batch of weight
// loads is issued, so that it cannot launch, and prefetch, further ahead.
#include "kernels/gemv.cuh"

#include <algorithm>
#include <atomic>
#include <utility>

#include "kernels/internal/common.cuh"
#include "kernels/internal/norm_rope_head.cuh"

namespace hr::kernels {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 8;
constexpr int kPrefetch = 2;  // pieces per lane and weight row pulled into L2 before the wait

// Input row i's elements [8 v, 8 v + 8) as floats.
template <GemvInput IN>
__device__ __forceinline__ void load_input(const GemvParams& p, int i, int v, float scale,
                                           float* xf) {
  if constexpr (IN == GemvInput::kBf16) {
    internal::bf16x8_to_float(
        __ldg(reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(i) * p.k) + v), xf);
  } else {
    const float4* r =
        reinterpret_cast<const float4*>(p.resid + static_cast<size_t>(i) * p.k) + 2 * v;
    const float4* w = reinterpret_cast<const float4*>(p.norm_weight) + 2 * v;
    const float4 r0 = __ldg(r), r1 = __ldg(r + 1), w0 = __ldg(w), w1 = __ldg(w + 1);
    xf[0] = r0.x * scale * w0.x;
    xf[1] = r0.y * scale * w0.y;
    xf[2] = r0.z * scale * w0.z;
    xf[3] = r0.w * scale * w0.w;
    xf[4] = r1.x * scale * w1.x;
    xf[5] = r1.y * scale * w1.y;
    xf[6] = r1.z * scale * w1.z;
    xf[7] = r1.w * scale * w1.w;
  }
}

// acc[r][i] += w_r[8 v, 8 v + 8) · input_i[8 v, 8 v + 8) for R weight rows and M input rows.
template <int M, int R, GemvInput IN>
__device__ __forceinline__ void accumulate(const GemvParams& p, const uint4* const* wrow,
                                           int num_vec, int lane, const float* scale,
                                           float (*acc)[M]) {
  int v = lane;
  for (; v + 32 * (kUnroll - 1) < num_vec; v += 32 * kUnroll) {
    // The last full batch of loads: the next kernel may launch (and prefetch) behind them.
    if (v + 32 * (2 * kUnroll - 1) >= num_vec) internal::pdl_launch_dependents();
    uint4 wv[R][kUnroll];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        wv[r][u] = __ldcs(wrow[r] + v + 32 * u);  // streamed: read once
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < M; ++i) {
        float xf[8];
        load_input<IN>(p, i, v + 32 * u, scale[i], xf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float wf[8];
          internal::bf16x8_to_float(wv[r][u], wf);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r][i] += wf[j] * xf[j];
        }
      }
    }
  }
  for (; v < num_vec; v += 32) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float xf[8];
      load_input<IN>(p, i, v, scale[i], xf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wf[8];
        internal::bf16x8_to_float(__ldcs(wrow[r] + v), wf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r][i] += wf[j] * xf[j];
      }
    }
  }
}

// This warp's share of p.prefetch: the warps of blocks from first_block on split each range in
// 16-byte-aligned pieces, one per warp (one bulk prefetch on Hopper, else a line per lane).
__device__ __forceinline__ void prefetch_share(const GemvParams& p, int first_block, int warp,
                                               int lane) {
  if (static_cast<int>(blockIdx.x) < first_block) return;
  const size_t warps = static_cast<size_t>(gridDim.x - first_block) * kWarpsPerBlock;
  const size_t me = static_cast<size_t>(blockIdx.x - first_block) * kWarpsPerBlock + warp;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const GemvPrefetch& range = p.prefetch[r];
    const size_t share = ((range.bytes + warps - 1) / warps + 15) / 16 * 16;
    const size_t begin = me * share;
    if (begin >= range.bytes) continue;
    const size_t size = min(share, range.bytes - begin);
    internal::prefetch_l2_range(static_cast<const char*>(range.ptr) + begin, size, lane);
  }
}

enum class GemvOut { kStore, kSwiglu, kResidual, kRopeKv };

// Weight rows per warp, and how many warps the output needs.
template <GemvOut OUT>
__host__ __device__ constexpr int rows_per_warp() {
  return OUT == GemvOut::kSwiglu || OUT == GemvOut::kRopeKv ? 2 : 1;
}
template <GemvOut OUT>
__host__ __device__ int num_warps(const GemvParams& p) {
  return OUT == GemvOut::kRopeKv ? p.n / 2 : p.n;
}

// The weight row that warp `col` reads as its r-th row: its column; the gate row and the up row
// (SwiGLU); the two rows of rotation pair `col` (RoPE: pair i of a head is rows i and i + hd / 2).
template <GemvOut OUT>
__device__ __forceinline__ size_t weight_row(const GemvParams& p, int col, int r) {
  if constexpr (OUT == GemvOut::kSwiglu)
    return static_cast<size_t>(col) + static_cast<size_t>(r) * p.n;
  if constexpr (OUT == GemvOut::kRopeKv) {
    const int half = p.rope.head_dim / 2;
    return static_cast<size_t>(col / half) * p.rope.head_dim + col % half + r * half;
  }
  return static_cast<size_t>(col);
}

// RoPE epilogue for input row i: a and b are rows (pair, pair + half) of head h of the q/k/v
// output.
__device__ __forceinline__ void rope_store(const GemvParams& p, int i, int col, float a, float b) {
  const int hd = p.rope.head_dim, half = hd / 2;
  const int h = col / half, e = col % half;
  const int q_size = p.rope.num_heads * hd, kv_size = p.rope.num_kv_heads * hd;
  const int r0 = h * hd + e;
  if (p.rope.bias) {
    a += p.rope.bias[r0];
    b += p.rope.bias[r0 + half];
  }
  if (h < p.rope.num_heads + p.rope.num_kv_heads) {
    float sn, cs;
    sincosf(static_cast<float>(p.rope.positions[i]) * p.rope.inv_freq[e], &sn, &cs);
    const float ra = a * cs - b * sn, rb = b * cs + a * sn;
    a = ra;
    b = rb;
  }
  __nv_bfloat16* dst;
  if (h < p.rope.num_heads) {
    dst = p.rope.q_out + static_cast<size_t>(i) * q_size + r0;
  } else {
    const size_t slot = static_cast<size_t>(p.rope.slot_mapping[i]) * kv_size;
    dst = h < p.rope.num_heads + p.rope.num_kv_heads
              ? p.rope.k_cache + slot + (r0 - q_size)
              : p.rope.v_cache + slot + (r0 - q_size - kv_size);
  }
  dst[0] = __float2bfloat16_rn(a);
  dst[half] = __float2bfloat16_rn(b);
}

// With the q/k norms: a query or key head's pair goes to the scratch rows as computed (the head's
// last block normalises and rotates it: rope_heads_tail), a value head's pair straight to the
// cache.
__device__ __forceinline__ void rope_stage(const GemvParams& p, int i, int col, float a, float b) {
  const int half = p.rope.head_dim / 2, h = col / half;
  if (h >= p.rope.num_heads + p.rope.num_kv_heads) {
    rope_store(p, i, col, a, b);
    return;
  }
  float* row = p.rope.scratch + static_cast<size_t>(i) * p.n + h * p.rope.head_dim + col % half;
  row[0] = a;
  row[half] = b;
}

// The block's head (its warps' pairs are all of one head): once the head's every block has
// staged its rows, the last one normalises and rotates it for each of the m tokens (a warp each),
// as rope_write_kv would from the same rows. Called by every thread of the block.
__device__ __forceinline__ void rope_heads_tail(const GemvParams& p, int m) {
  const GemvRope& r = p.rope;
  const int hd = r.head_dim, half = hd / 2;
  const int h = blockIdx.x * kWarpsPerBlock / half;
  if (h >= r.num_heads + r.num_kv_heads) return;  // (a value head: stored; block-uniform)
  __shared__ int last;
  __threadfence();  // this block's rows, before the count that publishes them
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(r.head_counters + h, 1) == half / kWarpsPerBlock - 1;
    if (last) {
      atomicExch(r.head_counters + h, 0);
      __threadfence();  // the other blocks' rows, counted before ours, are read after
    }
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int i = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (i >= m) return;
  const int q_size = r.num_heads * hd, kv_size = r.num_kv_heads * hd, base = h * hd;
  const float* row = r.scratch + static_cast<size_t>(i) * p.n + base;
  __nv_bfloat16* out =
      h < r.num_heads
          ? r.q_out + static_cast<size_t>(i) * q_size + base
          : r.k_cache + static_cast<size_t>(r.slot_mapping[i]) * kv_size + (base - q_size);
  internal::norm_rope_head([&](int c) { return __ldcg(row + c); }, r.bias ? r.bias + base : nullptr,
                           h < r.num_heads ? r.q_norm : r.k_norm, hd, r.eps,
                           static_cast<float>(r.positions[i]), r.inv_freq, out, lane);
}

template <int M, GemvInput IN, GemvOut OUT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_kernel(GemvParams p, int prefetch_first_block) {
  constexpr int R = rows_per_warp<OUT>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col = blockIdx.x * kWarpsPerBlock + warp;
  const bool active = col < num_warps<OUT>(p);  // warp-uniform
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    wrow[r] = reinterpret_cast<const uint4*>(p.w + weight_row<OUT>(p, active ? col : 0, r) * p.k);
  }
  const int num_vec = p.k / 8;
  // The weights are constant: pull this warp's first pieces into L2 while the previous kernel ends.
  if (active) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int u = 0; u < kPrefetch; ++u) {
        if (lane + 32 * u < num_vec) internal::prefetch_l2(wrow[r] + lane + 32 * u);
      }
    }
  }
  internal::pdl_wait();
  float scale[M];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    scale[i] = IN == GemvInput::kRmsNorm
                   ? rsqrtf(p.resid_sumsq[i] / static_cast<float>(p.k) + p.eps)
                   : 1.0f;
  }
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;
  }
  if (active) accumulate<M, R, IN>(p, wrow, num_vec, lane, scale, acc);
  internal::pdl_launch_dependents();  // (if no full batch did) only the epilogue is left
  if (p.prefetch[0].bytes + p.prefetch[1].bytes > 0)
    prefetch_share(p, prefetch_first_block, warp, lane);
  if constexpr (OUT == GemvOut::kResidual) {
    __shared__ float squares[M][kWarpsPerBlock];
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const float s = internal::warp_sum(acc[0][i]);
      if (lane == 0) {
        float r = 0.0f;
        if (active) {
          const size_t at = static_cast<size_t>(i) * p.n + col;
          r = p.resid_in[at] + s;
          p.resid_out[at] = r;
        }
        squares[i][warp] = r * r;
      }
    }
    __syncthreads();
    if (threadIdx.x < M) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarpsPerBlock; ++w) sum += squares[threadIdx.x][w];
      atomicAdd(p.out_sumsq + threadIdx.x, sum);
    }
  } else if constexpr (OUT == GemvOut::kRopeKv) {
    const bool normed = p.rope.q_norm != nullptr;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const float a = internal::warp_sum(acc[0][i]);
      const float b = internal::warp_sum(acc[1][i]);
      if (lane == 0 && active) {
        if (normed) {
          rope_stage(p, i, col, a, b);
        } else {
          rope_store(p, i, col, a, b);
        }
      }
    }
    if (normed) rope_heads_tail(p, M);
  } else {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const float s = internal::warp_sum(acc[0][i]);
      const float u = R == 2 ? internal::warp_sum(acc[R - 1][i]) : 0.0f;
      if (lane == 0 && active) {
        const size_t at = static_cast<size_t>(i) * p.n + col;
        if (OUT == GemvOut::kSwiglu) {
          reinterpret_cast<__nv_bfloat16*>(p.y)[at] =
              __float2bfloat16_rn(s / (1.0f + __expf(-s)) * u);
        } else if (p.y_bf16) {
          reinterpret_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16_rn(s);
        } else {
          reinterpret_cast<float*>(p.y)[at] = s;
        }
      }
    }
  }
}

// The first block of the kernel's last wave: the last blocks that are resident together at its
// end (the device's SMs times how many of the kernel's blocks fit on one), a full wave's worth
// where there are that many.
template <int M, GemvInput IN, GemvOut OUT>
cudaError_t last_wave_start(int blocks, int* first) {
  constexpr int kDevices = 64;
  static std::atomic<int> resident[kDevices];  // per kernel and device, once known
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  int n = device < kDevices ? resident[device].load() : 0;
  if (n == 0) {
    int sms = 0, per_sm = 0;
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess) {
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<M, IN, OUT>,
                                                        kWarpsPerBlock * 32, 0);
    }
    if (e != cudaSuccess) return e;
    n = std::max(1, sms * per_sm);
    if (device < kDevices) resident[device].store(n);
  }
  *first = std::max(0, blocks - n);
  return cudaSuccess;
}

template <int M, GemvInput IN, GemvOut OUT>
cudaError_t launch_gemv(const GemvParams& p, cudaStream_t stream) {
  const int blocks = (num_warps<OUT>(p) + kWarpsPerBlock - 1) / kWarpsPerBlock;
  int first = 0;
  if (p.prefetch[0].bytes + p.prefetch[1].bytes > 0) {
    if (cudaError_t e = last_wave_start<M, IN, OUT>(blocks, &first); e != cudaSuccess) return e;
  }
  return internal::launch(gemv_kernel<M, IN, OUT>, dim3(blocks), dim3(kWarpsPerBlock * 32), 0,
                          stream, p, first);
}

template <int M, GemvInput IN>
cudaError_t launch_out(const GemvParams& p, cudaStream_t stream) {
  if (p.resid_out) return launch_gemv<M, IN, GemvOut::kResidual>(p, stream);
  if (p.rope.q_out) return launch_gemv<M, IN, GemvOut::kRopeKv>(p, stream);
  if (p.swiglu) return launch_gemv<M, IN, GemvOut::kSwiglu>(p, stream);
  return launch_gemv<M, IN, GemvOut::kStore>(p, stream);
}

template <int M>
cudaError_t launch_fused(const GemvParams& p, cudaStream_t stream) {
  return p.input == GemvInput::kRmsNorm ? launch_out<M, GemvInput::kRmsNorm>(p, stream)
                                        : launch_out<M, GemvInput::kBf16>(p, stream);
}

bool valid_rope(const GemvParams& p) {
  const GemvRope& r = p.rope;
  if (r.q_norm &&
      (!r.k_norm || !r.scratch || !r.head_counters || !gemv_fuses_qk_norm(r.head_dim))) {
    return false;
  }
  return r.head_dim > 0 && r.head_dim % 2 == 0 && r.num_heads > 0 && r.num_kv_heads > 0 &&
         p.n == (r.num_heads + 2 * r.num_kv_heads) * r.head_dim && r.k_cache && r.v_cache &&
         r.positions && r.slot_mapping && r.inv_freq && !r.k_norm == !r.q_norm && !p.resid_out &&
         !p.swiglu;
}

template <int M, GemvInput IN>
cudaError_t prepare_outputs() {
  int first = 0;
  for (cudaError_t e : {last_wave_start<M, IN, GemvOut::kStore>(0, &first),
                        last_wave_start<M, IN, GemvOut::kResidual>(0, &first),
                        last_wave_start<M, IN, GemvOut::kRopeKv>(0, &first),
                        last_wave_start<M, IN, GemvOut::kSwiglu>(0, &first)}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <int... M>
cudaError_t prepare_plain(std::integer_sequence<int, M...>) {
  int first = 0;
  for (cudaError_t e : {last_wave_start<M + 1, GemvInput::kBf16, GemvOut::kStore>(0, &first)...}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t gemv_prepare() {
  static_assert(kGemvMaxFusedRows == 2);
  for (cudaError_t e :
       {prepare_plain(std::make_integer_sequence<int, kGemvMaxRows>{}),
        prepare_outputs<1, GemvInput::kBf16>(), prepare_outputs<1, GemvInput::kRmsNorm>(),
        prepare_outputs<2, GemvInput::kBf16>(), prepare_outputs<2, GemvInput::kRmsNorm>()}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

bool gemv_fuses_qk_norm(int head_dim) {
  return head_dim > 0 && head_dim % 2 == 0 && (head_dim / 2) % kWarpsPerBlock == 0;
}

cudaError_t gemv(const GemvParams& p, cudaStream_t stream) {
  if (p.m < 1 || p.m > kGemvMaxRows || p.n < 1 || p.k < 8 || p.k % 8 != 0 || !p.w)
    return cudaErrorInvalidValue;
  const bool rope = p.rope.q_out != nullptr;
  const bool fused = p.input != GemvInput::kBf16 || p.resid_out != nullptr || p.swiglu || rope;
  if (fused && p.m > kGemvMaxFusedRows) return cudaErrorInvalidValue;
  if (rope && !valid_rope(p)) return cudaErrorInvalidValue;
  if (p.input == GemvInput::kRmsNorm ? (!p.resid || !p.resid_sumsq || !p.norm_weight) : !p.x) {
    return cudaErrorInvalidValue;
  }
  if (p.resid_out ? (!p.resid_in || !p.out_sumsq || p.resid_in == p.resid_out || p.swiglu)
                  : (!p.y && !rope)) {
    return cudaErrorInvalidValue;
  }
  for (const GemvPrefetch& r : p.prefetch) {
    if (r.bytes % 16 != 0 || (r.bytes > 0 && (!r.ptr || !internal::aligned16(r.ptr))) ||
        r.bytes > 0xFFFFFFF0u) {
      return cudaErrorInvalidValue;
    }
  }
  if (!internal::aligned16(p.w) || (p.x && !internal::aligned16(p.x)) ||
      (p.resid && !internal::aligned16(p.resid)) ||
      (p.norm_weight && !internal::aligned16(p.norm_weight))) {
    return cudaErrorMisalignedAddress;
  }
  if (fused) return p.m == 1 ? launch_fused<1>(p, stream) : launch_fused<2>(p, stream);
  switch (p.m) {
    case 1:
      return launch_gemv<1, GemvInput::kBf16, GemvOut::kStore>(p, stream);
    case 2:
      return launch_gemv<2, GemvInput::kBf16, GemvOut::kStore>(p, stream);
    case 3:
      return launch_gemv<3, GemvInput::kBf16, GemvOut::kStore>(p, stream);
    case 4:
      return launch_gemv<4, GemvInput::kBf16, GemvOut::kStore>(p, stream);
    case 5:
      return launch_gemv<5, GemvInput::kBf16, GemvOut::kStore>(p, stream);
    case 6:
      return launch_gemv<6, GemvInput::kBf16, GemvOut::kStore>(p, stream);
    case 7:
      return launch_gemv<7, GemvInput::kBf16, GemvOut::kStore>(p, stream);
    default:
      return launch_gemv<8, GemvInput::kBf16, GemvOut::kStore>(p, stream);
  }
}

}  // namespace hr::kernels
