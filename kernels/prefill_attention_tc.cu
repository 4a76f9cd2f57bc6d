// Paged attention on tensor cores, FlashAttention-2 style: one block of 8 warps per (work item, KV
// head), 128 query rows (token x group head, 16 per warp), key tiles of 64 positions gathered from
// the paged cache into shared memory with cp.async, two tiles in flight. Each warp keeps its
// scores, softmax state and output accumulators in registers: S = Q K^T and O += P V are
// mma.sync m16n8k16 bf16 products with fp32 accumulation, and P goes from the S accumulators
// straight into the A operand of the second product (the m16n8 accumulator layout matches the
// m16k16 operand layout pairwise). Warps whose 16 rows are all padding skip the arithmetic.
#include "kernels/internal/attention_launch.cuh"
#include "kernels/internal/common.cuh"
#include "kernels/internal/mma.cuh"
#include "kernels/internal/prefill_attention_tc.cuh"
#include "kernels/internal/split_combine.cuh"

namespace hr::kernels::internal {
namespace {

constexpr int kRows = kAttentionPrefillRows;  // 128
constexpr int kWarps = kRows / 16;
constexpr int kThreads = kWarps * 32;
constexpr int kKeys = kAttentionTcKeyTile;

template <int HD>
struct TcSmem {
  static constexpr int kLd = HD + 8;  // bf16 row stride: 16-byte rows, conflict-free fragment loads
  static constexpr int kQ = kRows * kLd;
  static constexpr int kKv = kKeys * kLd;                                   // one K or V tile
  static constexpr size_t kBytes = sizeof(__nv_bfloat16) * (kQ + 4 * kKv);  // Q, 2 x (K, V)
};

template <int HD>
__global__ void __launch_bounds__(kThreads, 2)
    prefill_attention_tc_kernel(PagedAttentionParams p, const AttentionWorkItem* items) {
  pdl_wait();
  using Sm = TcSmem<HD>;
  constexpr int kChunks = HD / 16;  // k-chunks of Q K^T, and pairs of 8-wide output tiles
  HR_DYNAMIC_SMEM(unsigned char, smem, 128);
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* kv_s = q_s + Sm::kQ;  // stage s: K at kv_s + 2 s kKv, V after it

  const AttentionWorkItem it = items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int group = p.num_heads / p.num_kv_heads;
  const int rows = it.q_len * group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* table = p.block_table + static_cast<size_t>(it.seq) * p.max_blocks_per_seq;
  const int num_tiles = (it.kv_end - it.kv_begin + kKeys - 1) / kKeys;
  if (num_tiles <= 0) {
    finish_empty_split(p, it, kvh, group);
    return;
  }

  // Q rows (zeros past `rows`) and the first K/V tile, asynchronously.
  constexpr int kVecPerRow = HD / 8;
  for (int e = threadIdx.x; e < kRows * kVecPerRow; e += kThreads) {
    const int r = e / kVecPerRow, c = (e % kVecPerRow) * 8;
    const bool valid = r < rows;
    size_t off = 0;
    if (valid)
      off =
          (static_cast<size_t>(it.q_row + r / group) * p.num_heads + kvh * group + r % group) * HD +
          c;
    cp_async16(q_s + r * Sm::kLd + c, p.q + off, valid);
  }
  load_kv_tile<HD, kThreads>(p, table, kvh, it.kv_begin, it.kv_end, kv_s, kv_s + Sm::kKv);
  cp_async_commit();

  // This lane's two rows within the warp's 16: r_a = lane / 4 and r_b = r_a + 8.
  const int r_a = warp * 16 + lane / 4, r_b = r_a + 8;
  const int qpos_a = r_a < rows ? p.positions[it.q_row + r_a / group] : -1;
  const int qpos_b = r_b < rows ? p.positions[it.q_row + r_b / group] : -1;
  const bool active = warp * 16 < rows;  // warp-uniform
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  float o[2 * kChunks][4];
#pragma unroll
  for (int n = 0; n < 2 * kChunks; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int t0 = it.kv_begin + tile * kKeys;
    if (tile + 1 < num_tiles) {
      __nv_bfloat16* next = kv_s + ((tile + 1) % 2) * 2 * Sm::kKv;
      load_kv_tile<HD, kThreads>(p, table, kvh, t0 + kKeys, it.kv_end, next, next + Sm::kKv);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* k_s = kv_s + (tile % 2) * 2 * Sm::kKv;
    const __nv_bfloat16* v_s = k_s + Sm::kKv;
    if (active) {
      // S = Q K^T: 16 rows x 64 keys as eight 16x8 tiles.
      float s[kKeys / 8][4];
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < kChunks; ++kc) {
        uint32_t a[4];
        ldmatrix_x4(a, q_s + (warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * Sm::kLd + kc * 16 +
                           (lane / 16) * 8);
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
          const __nv_bfloat16* kp = k_s + (n * 8 + lane / 4) * Sm::kLd + kc * 16 + (lane % 4) * 2;
          mma16816(s[n], a, *reinterpret_cast<const uint32_t*>(kp),
                   *reinterpret_cast<const uint32_t*>(kp + 8));
        }
      }
      // Mask, scale, and the online softmax over this tile.
      float alpha_a, alpha_b;
      online_softmax_tile<kKeys / 8>(s, t0, it.kv_end, qpos_a, qpos_b, p.scale, m_a, m_b, l_a, l_b,
                                     alpha_a, alpha_b);
#pragma unroll
      for (int n = 0; n < 2 * kChunks; ++n) {
        o[n][0] *= alpha_a;
        o[n][1] *= alpha_a;
        o[n][2] *= alpha_b;
        o[n][3] *= alpha_b;
      }
      // O += P V, 16 keys at a time; V fragments through ldmatrix.trans, two 8-wide tiles per load.
#pragma unroll
      for (int kc = 0; kc < kKeys / 16; ++kc) {
        uint32_t a[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]),
                         pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                         pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                         pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
        for (int nc = 0; nc < kChunks; ++nc) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_s + (kc * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * Sm::kLd +
                                   nc * 16 + (lane / 16) * 8);
          mma16816(o[2 * nc], a, b[0], b[1]);
          mma16816(o[2 * nc + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the next iteration's loads overwrite this stage
  }
  cp_async_wait<0>();       // (the last tile already waited for every copy)
  pdl_launch_dependents();  // only the epilogue is left

  // Each lane writes columns (lane % 4) * 2 + {0, 1} of every 8-wide tile, for rows r_a and r_b.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? r_b : r_a;
    if (!active || r >= rows) continue;
    const float l = half ? l_b : l_a, m = half ? m_b : m_a;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int tok = it.q_row + r / group, head = kvh * group + r % group;
    if (it.partial < 0) {
      __nv_bfloat16* out =
          p.out + (static_cast<size_t>(tok) * p.num_heads + head) * HD + (lane % 4) * 2;
#pragma unroll
      for (int n = 0; n < 2 * kChunks; ++n) {
        *reinterpret_cast<__nv_bfloat162*>(out + n * 8) =
            __floats2bfloat162_rn(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
      }
    } else {
      const size_t slot = static_cast<size_t>(it.partial) * p.num_heads + head;
      float* out = p.partial_out + slot * HD + (lane % 4) * 2;
#pragma unroll
      for (int n = 0; n < 2 * kChunks; ++n) {
        out[n * 8] = o[n][2 * half] * inv;
        out[n * 8 + 1] = o[n][2 * half + 1] * inv;
      }
      if (lane % 4 == 0) {
        p.partial_ml[slot * 2] = m;
        p.partial_ml[slot * 2 + 1] = l;
      }
    }
  }
  if (it.partial >= 0 && p.combine_counters) merge_if_last_split(p, it, kvh, group);
}

}  // namespace

cudaError_t prefill_attention_tc(const PagedAttentionParams& p, const AttentionWorkItem* items,
                                 int num_items, cudaStream_t stream) {
  if (!aligned16(p.q)) return cudaErrorMisalignedAddress;
  return for_head_dim(p.head_dim, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    return launch_attention<prefill_attention_tc_kernel<HD>>(p, items, num_items, kThreads,
                                                             TcSmem<HD>::kBytes, stream);
  });
}

}  // namespace hr::kernels::internal

namespace hr::kernels {

size_t paged_attention_smem_bytes(int head_dim) {
  size_t bytes = 0;
  internal::for_head_dim(head_dim, [&](auto hd) {
    bytes = internal::TcSmem<decltype(hd)::value>::kBytes;
    return cudaSuccess;
  });
  return bytes;
}

}  // namespace hr::kernels
