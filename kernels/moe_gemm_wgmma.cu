// The experts' grouped GEMM on Hopper's warpgroups (MoeKernel::kGroupedGemmWarpgroup): a block
// is one warpgroup (four warps) over a tile of kMoeTile sorted rows and kN output columns (gate/up:
// 128, with their 128 up columns; down: 256), k-slices of 64 staged by cp.async into 128-byte
// swizzled K-major tiles (kernels/internal/wgmma.cuh), each slice four wgmma k16 steps of
// m64n128 (gate and up apart, A shared) or m64n256, issued asynchronously while the next slice
// loads. The epilogue is the other grouped GEMM's: SwiGLU into act, or each row's output times
// its pair's weight into out.
#include "kernels/internal/common.cuh"
#include "kernels/internal/mma.cuh"
#include "kernels/internal/moe_experts.cuh"
#include "kernels/internal/wgmma.cuh"
#include "kernels/moe.cuh"

namespace hr::kernels::internal {
namespace {

constexpr int kWgThreads = 128;  // one warpgroup
constexpr int kWgK = 64;         // bf16 a slice: one 128-byte swizzled row
constexpr int kWgStages = 2;     // two 40 KB stages: two blocks an SM

template <bool kGateUp>
struct WgShape {
  static constexpr int kN = kGateUp ? 128 : 256;        // output columns a block
  static constexpr int kBRows = kGateUp ? 2 * kN : kN;  // weight rows a stage (gate, then up)
  static constexpr int kAccs = kGateUp ? 2 * kN / 2 : kN / 2;  // fp32 accumulators a thread
  static constexpr uint32_t kATileBytes = kMoeTile * 128;
  static constexpr uint32_t kStageBytes = kATileBytes + kBRows * 128;
  // (+ 1 KiB: the tiles start at the first 1 KiB boundary of the dynamic shared memory.)
  static constexpr size_t kSmemBytes = kWgStages * kStageBytes + 1024;
};
static_assert(kMoeTile == 64, "a wgmma's m is 64: one sorted tile");

template <bool kGateUp>
__global__ void __launch_bounds__(kWgThreads) moe_gemm_wgmma_kernel(MoeExpertsParams p) {
  using S = WgShape<kGateUp>;
  pdl_launch_dependents();
  pdl_wait();
  HR_DYNAMIC_SMEM(char, raw, 128);
  __shared__ int pair_s[kMoeTile], token_s[kMoeTile];
  const int tile = blockIdx.y;
  const int e = p.layout.tile_experts[tile];
  if (e < 0) return;
  const int held = held_expert(p, e);
  if (held < 0) return;
  const int F = p.ffn, D = p.dim;
  const int N = kGateUp ? F : D, K = kGateUp ? D : F;
  const int row0 = tile * kMoeTile, n0 = blockIdx.x * S::kN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  char* tiles = raw + ((1024u - shared_addr(raw) % 1024u) % 1024u);
  stage_tile_rows<kGateUp>(p, row0, pair_s, token_s);
  const __nv_bfloat16* wbase = expert_weights<kGateUp>(p, held);
  const __nv_bfloat16* abase = kGateUp ? p.x : p.act;
  auto a_tile = [&](int s) { return tiles + s * S::kStageBytes; };
  auto b_tile = [&](int s) { return tiles + s * S::kStageBytes + S::kATileBytes; };

  // One k-slice into stage s, swizzled, as one copy group (empty past the last slice).
  auto load = [&](int s, int k0) {
    if (k0 < K) {
      for (int c = threadIdx.x; c < kMoeTile * 8; c += kWgThreads) {
        const int r = c / 8, chunk = c % 8, kc = k0 + chunk * 8;
        const int src = tile_a_row<kGateUp>(pair_s, token_s, row0, r);
        const bool valid = src >= 0 && kc < K;
        cp_async16(a_tile(s) + sw128_offset(r, chunk),
                   valid ? abase + static_cast<size_t>(src) * K + kc : wbase, valid);
      }
      for (int c = threadIdx.x; c < S::kBRows * 8; c += kWgThreads) {
        const int i = c / 8, chunk = c % 8, kc = k0 + chunk * 8;
        // gate/up: rows [0, kN) of the stage are gate rows, [kN, 2 kN) their up rows.
        const int b = kGateUp && i >= S::kN ? 1 : 0;
        const int n = n0 + i - b * S::kN;
        const bool valid = n < N && kc < K;
        cp_async16(b_tile(s) + sw128_offset(i, chunk),
                   valid ? wbase + (static_cast<size_t>(b) * F + n) * K + kc : wbase, valid);
      }
    }
    cp_async_commit();
  };

  float acc[S::kAccs];
#pragma unroll
  for (int i = 0; i < S::kAccs; ++i) acc[i] = 0.0f;
  const int slices = (K + kWgK - 1) / kWgK;
  for (int s = 0; s < kWgStages - 1; ++s) load(s, s * kWgK);
  for (int ks = 0; ks < slices; ++ks) {
    cp_async_wait<kWgStages - 2>();  // this thread's copies of slice ks have landed
    fence_proxy_async();             // ... and are visible to wgmma's reads
    __syncthreads();  // every thread's; and every warp waited for the products of slice ks - 1
    // The next slice into the stage slice ks - 1 used (its products done: waited for below).
    load((ks + kWgStages - 1) % kWgStages, (ks + kWgStages - 1) * kWgK);
    const int s = ks % kWgStages;
    const uint32_t a = shared_addr(a_tile(s)), b = shared_addr(b_tile(s));
    wgmma_fence_operands(acc, S::kAccs);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kWgK / 16; ++kk) {
      const uint64_t da = wgmma_desc_sw128(a + kk * 32);
      if (kGateUp) {
        wgmma_m64n128k16(acc, da, wgmma_desc_sw128(b + kk * 32));
        wgmma_m64n128k16(acc + S::kN / 2, da, wgmma_desc_sw128(b + S::kN * 128 + kk * 32));
      } else {
        wgmma_m64n256k16(acc, da, wgmma_desc_sw128(b + kk * 32));
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(acc, S::kAccs);
  }
  cp_async_wait<0>();  // (only empty groups are left)

  // Thread t holds, of each 8 columns j, rows 16 (t / 32) + (t % 32) / 4 and that + 8, columns
  // 8j + 2 (t % 4) and + 1: d[4j], d[4j + 1], then the row 8 below's d[4j + 2], d[4j + 3].
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp * 16 + lane / 4 + half * 8;
    const int pair = pair_s[r];
    if (pair < 0) continue;
    const float weight = kGateUp ? 0.0f : p.topk_weights[pair];
#pragma unroll
    for (int j = 0; j < S::kN / 8; ++j) {
      const int col = n0 + j * 8 + (lane % 4) * 2;
      if (col >= N) continue;
      // (gate/up: the up accumulators follow the gate ones; down has none.)
      const int u = kGateUp ? S::kN / 2 : 0;
      store_column_pair<kGateUp>(p, row0 + r, pair, weight, col, acc[4 * j + 2 * half],
                                 acc[4 * j + 2 * half + 1], acc[u + 4 * j + 2 * half],
                                 acc[u + 4 * j + 2 * half + 1]);
    }
  }
}

// Whether the current device runs this build's wgmma: a Hopper GPU, and sm_90a code built (else
// the kernel is the compute_80 stub that traps), asked once per device.
bool hopper() {
#if !defined(HEADROOM_SIMT) && !defined(HEADROOM_KERNELS_SM90A)
  return false;
#else
  return once_per_device([](int device) {
    int major = 0;
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
               cudaSuccess &&
           major == 9;
  });
#endif
}

}  // namespace

cudaError_t moe_grouped_gemm_wgmma(const MoeExpertsParams& p, cudaStream_t stream) {
  using GateUp = WgShape<true>;
  using Down = WgShape<false>;
  if (!hopper()) return cudaErrorNotSupported;
  return launch_gate_up_then_down<moe_gemm_wgmma_kernel<true>, moe_gemm_wgmma_kernel<false>>(
      p, {GateUp::kN, kWgThreads, GateUp::kSmemBytes}, {Down::kN, kWgThreads, Down::kSmemBytes},
      stream);
}

}  // namespace hr::kernels::internal

namespace hr::kernels {

bool moe_warpgroup_gemm_runs() { return internal::hopper(); }

}  // namespace hr::kernels
