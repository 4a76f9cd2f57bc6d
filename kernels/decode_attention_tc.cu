// Decode attention on tensor cores, the keys shared out among warps (flash-decoding within a
// block): one block of 4 warps per (work item, KV head) for one decoding token, whose group's heads
// (up to 16) are the rows of one m16 tile. Key tiles of 64 positions are gathered from the paged
// cache with cp.async, two in flight, as in the prefill kernel; warp w takes keys [16 w, 16 w + 16)
// of every tile with its own softmax state and output accumulators (S = Q K^T and O += P V on
// mma.sync, Q's fragments kept in registers), and the four warps' results are merged through
// shared memory at the end. Per tile a warp does a quarter of the arithmetic the prefill kernel's
// one active warp does for a decode item (16 keys instead of 64), and a block needs 71% of that
// kernel's shared memory (74 KB at head_dim 128: three blocks per multiprocessor instead of two),
// so that memory, not one warp's arithmetic, bounds large decode batches.
#include "kernels/internal/attention_launch.cuh"
#include "kernels/internal/common.cuh"
#include "kernels/internal/decode_attention_tc.cuh"
#include "kernels/internal/mma.cuh"
#include "kernels/internal/split_combine.cuh"

namespace hr::kernels::internal {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kKeys = kAttentionTcKeyTile;
static_assert(kKeys == kWarps * 16, "each warp takes 16 keys of a tile");
static_assert(kAttentionDecodeTcRows == 16, "the group's heads fill one m16 tile");

template <int HD>
struct DecodeSmem {
  static constexpr int kLd = HD + 8;  // bf16 row stride, as in the prefill kernel
  static constexpr int kQ = 16 * kLd;
  static constexpr int kKv = kKeys * kLd;                                   // one K or V tile
  static constexpr size_t kBytes = sizeof(__nv_bfloat16) * (kQ + 4 * kKv);  // Q, 2 x (K, V)
  // After the key loop the K/V stages hold the warps' results, all fp32: outputs
  // [kWarps][16][kOutLd] (rows padded so that a warp's stores fall in distinct banks), running max
  // and sum [kWarps][16][2], and each row's common max and 1 / sum [16][2].
  static constexpr int kOutLd = HD + 8;
  static constexpr size_t kMergeBytes = sizeof(float) * (kWarps * 16 * (kOutLd + 2) + 16 * 2);
  static_assert(kMergeBytes <= sizeof(__nv_bfloat16) * 4 * kKv, "the merge fits in the K/V stages");
};

template <int HD>
__global__ void __launch_bounds__(kThreads, 3)
    decode_attention_tc_kernel(PagedAttentionParams p, const AttentionWorkItem* items) {
  pdl_wait();
  using Sm = DecodeSmem<HD>;
  constexpr int kChunks = HD / 16;  // k-chunks of Q K^T, and pairs of 8-wide output tiles
  HR_DYNAMIC_SMEM(unsigned char, smem, 128);
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* kv_s = q_s + Sm::kQ;  // stage s: K at kv_s + 2 s kKv, V after it

  const AttentionWorkItem it = items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int group = p.num_heads / p.num_kv_heads;  // rows: the group's heads for the one token
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* table = p.block_table + static_cast<size_t>(it.seq) * p.max_blocks_per_seq;
  const int num_tiles = (it.kv_end - it.kv_begin + kKeys - 1) / kKeys;
  if (num_tiles <= 0) {
    finish_empty_split(p, it, kvh, group);
    return;
  }

  // Q's rows (zeros past the group) and the first K/V tile, asynchronously.
  constexpr int kVecPerRow = HD / 8;
  for (int e = threadIdx.x; e < 16 * kVecPerRow; e += kThreads) {
    const int r = e / kVecPerRow, c = (e % kVecPerRow) * 8;
    const bool valid = r < group;
    size_t off = 0;
    if (valid) off = (static_cast<size_t>(it.q_row) * p.num_heads + kvh * group + r) * HD + c;
    cp_async16(q_s + r * Sm::kLd + c, p.q + off, valid);
  }
  load_kv_tile<HD, kThreads>(p, table, kvh, it.kv_begin, it.kv_end, kv_s, kv_s + Sm::kKv);
  cp_async_commit();

  const int qpos = p.positions[it.q_row];
  const int key0 = warp * 16;  // this warp's keys within each tile
  // This lane's rows of the tile: r_a = lane / 4 and r_b = r_a + 8 (same token, so same position).
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  float o[2 * kChunks][4];
#pragma unroll
  for (int n = 0; n < 2 * kChunks; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  uint32_t qa[kChunks][4];  // Q's A fragments, the same for every tile

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
    if (tile == 0) {
#pragma unroll
      for (int kc = 0; kc < kChunks; ++kc) {
        ldmatrix_x4(qa[kc], q_s + ((lane % 8) + ((lane / 8) % 2) * 8) * Sm::kLd + kc * 16 +
                                (lane / 16) * 8);
      }
    }
    const __nv_bfloat16* k_s = kv_s + (tile % 2) * 2 * Sm::kKv;
    const __nv_bfloat16* v_s = k_s + Sm::kKv;
    // S = Q K^T over this warp's 16 keys: two 16x8 tiles.
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < kChunks; ++kc) {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const __nv_bfloat16* kp =
            k_s + (key0 + n * 8 + lane / 4) * Sm::kLd + kc * 16 + (lane % 4) * 2;
        mma16816(s[n], qa[kc], *reinterpret_cast<const uint32_t*>(kp),
                 *reinterpret_cast<const uint32_t*>(kp + 8));
      }
    }
    // Mask, scale, and the online softmax over the warp's keys (both rows: the same token).
    float alpha_a, alpha_b;
    online_softmax_tile<2>(s, t0 + key0, it.kv_end, qpos, qpos, p.scale, m_a, m_b, l_a, l_b,
                           alpha_a, alpha_b);
    // O = O alpha + P V over the warp's 16 keys; V fragments through ldmatrix.trans.
    const uint32_t a[4] = {pack_bf16(s[0][0], s[0][1]), pack_bf16(s[0][2], s[0][3]),
                           pack_bf16(s[1][0], s[1][1]), pack_bf16(s[1][2], s[1][3])};
#pragma unroll
    for (int nc = 0; nc < kChunks; ++nc) {
      o[2 * nc][0] *= alpha_a;
      o[2 * nc][1] *= alpha_a;
      o[2 * nc][2] *= alpha_b;
      o[2 * nc][3] *= alpha_b;
      o[2 * nc + 1][0] *= alpha_a;
      o[2 * nc + 1][1] *= alpha_a;
      o[2 * nc + 1][2] *= alpha_b;
      o[2 * nc + 1][3] *= alpha_b;
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_s + (key0 + (lane % 8) + ((lane / 8) % 2) * 8) * Sm::kLd + nc * 16 +
                               (lane / 16) * 8);
      mma16816(o[2 * nc], a, b[0], b[1]);
      mma16816(o[2 * nc + 1], a, b[2], b[3]);
    }
    __syncthreads();  // the next iteration's loads overwrite this stage; after the last, the merge
                      // does
  }
  pdl_launch_dependents();  // only the merge and the epilogue are left

  // The warps' results: each warp's rows scaled to the rows' common max, then summed.
  float* o_s = reinterpret_cast<float*>(kv_s);   // [kWarps][16][kOutLd]
  float* ml_s = o_s + kWarps * 16 * Sm::kOutLd;  // [kWarps][16][2]
  float* row_s = ml_s + kWarps * 16 * 2;         // [16][2]: common max, 1 / sum
  const int r_a = lane / 4, r_b = r_a + 8;
  if (lane % 4 == 0) {
    ml_s[(warp * 16 + r_a) * 2] = m_a;
    ml_s[(warp * 16 + r_a) * 2 + 1] = l_a;
    ml_s[(warp * 16 + r_b) * 2] = m_b;
    ml_s[(warp * 16 + r_b) * 2 + 1] = l_b;
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    const int r = threadIdx.x;
    float mx = -INFINITY, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, ml_s[(w * 16 + r) * 2]);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = ml_s[(w * 16 + r) * 2];
      if (mw != -INFINITY) sum += ml_s[(w * 16 + r) * 2 + 1] * __expf(mw - mx);
    }
    row_s[r * 2] = mx;
    row_s[r * 2 + 1] = sum;
  }
  __syncthreads();
  const float f_a = m_a == -INFINITY ? 0.0f : __expf(m_a - row_s[r_a * 2]);
  const float f_b = m_b == -INFINITY ? 0.0f : __expf(m_b - row_s[r_b * 2]);
#pragma unroll
  for (int n = 0; n < 2 * kChunks; ++n) {
    const int col = n * 8 + (lane % 4) * 2;
    *reinterpret_cast<float2*>(o_s + (warp * 16 + r_a) * Sm::kOutLd + col) =
        make_float2(o[n][0] * f_a, o[n][1] * f_a);
    *reinterpret_cast<float2*>(o_s + (warp * 16 + r_b) * Sm::kOutLd + col) =
        make_float2(o[n][2] * f_b, o[n][3] * f_b);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < group * HD; e += kThreads) {
    const int r = e / HD, d = e % HD;
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) acc += o_s[(w * 16 + r) * Sm::kOutLd + d];
    const float sum = row_s[r * 2 + 1];
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int head = kvh * group + r;
    if (it.partial < 0) {
      p.out[(static_cast<size_t>(it.q_row) * p.num_heads + head) * HD + d] =
          __float2bfloat16_rn(acc * inv);
    } else {
      const size_t slot = static_cast<size_t>(it.partial) * p.num_heads + head;
      p.partial_out[slot * HD + d] = acc * inv;
      if (d == 0) {
        p.partial_ml[slot * 2] = row_s[r * 2];
        p.partial_ml[slot * 2 + 1] = sum;
      }
    }
  }
  if (it.partial >= 0 && p.combine_counters) merge_if_last_split(p, it, kvh, group);
}

}  // namespace

cudaError_t decode_attention_tc(const PagedAttentionParams& p, const AttentionWorkItem* items,
                                int num_items, cudaStream_t stream) {
  if (!aligned16(p.q)) return cudaErrorMisalignedAddress;
  return for_head_dim(p.head_dim, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    return launch_attention<decode_attention_tc_kernel<HD>>(p, items, num_items, kThreads,
                                                            DecodeSmem<HD>::kBytes, stream);
  });
}

}  // namespace hr::kernels::internal
