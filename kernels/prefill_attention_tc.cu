// Prefill attention on tensor cores, flash-attention style: one block of 4 warps per (work item,
// KV head), 64 query rows (token x group head), key tiles of 64 positions gathered from the paged
// cache into shared memory. Each warp owns 16 rows: S = Q K^T with bf16 WMMA (fp32 accumulate),
// the online softmax in fp32 on its rows, P (bf16) V accumulated into the warp's rows of an fp32
// output tile in shared memory, rescaled by exp(m_old - m_new) before each tile's product.
#include <mma.h>

#include <mutex>

#include "kernels/internal/common.cuh"
#include "kernels/internal/prefill_attention_tc.cuh"

namespace hr::kernels::internal {
namespace {

using namespace nvcuda;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = kAttentionPrefillRows;  // 64 = kWarps * 16
constexpr int kKeys = 64;                     // keys per tile

template <int HD>
struct TcSmem {
  static constexpr int kLdH = HD + 8;     // bf16 row stride of Q, K, V (padding against bank conflicts)
  static constexpr int kLdS = kKeys + 4;  // fp32 row stride of S
  static constexpr int kLdP = kKeys + 8;  // bf16 row stride of P
  static constexpr int kLdO = HD + 4;     // fp32 row stride of O
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + sizeof(__nv_bfloat16) * kRows * kLdH;
  static constexpr size_t kV = kK + sizeof(__nv_bfloat16) * kKeys * kLdH;
  static constexpr size_t kS = kV + sizeof(__nv_bfloat16) * kKeys * kLdH;
  static constexpr size_t kP = kS + sizeof(float) * kRows * kLdS;
  static constexpr size_t kO = kP + sizeof(__nv_bfloat16) * kRows * kLdP;
  static constexpr size_t kBytes = kO + sizeof(float) * kRows * kLdO;
};

template <int HD>
__global__ void __launch_bounds__(kThreads) prefill_attention_tc_kernel(PagedAttentionParams p,
                                                                        const AttentionWorkItem* items) {
  using Sm = TcSmem<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem + Sm::kQ);
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem + Sm::kK);
  __nv_bfloat16* v_s = reinterpret_cast<__nv_bfloat16*>(smem + Sm::kV);
  float* s_s = reinterpret_cast<float*>(smem + Sm::kS);
  __nv_bfloat16* p_s = reinterpret_cast<__nv_bfloat16*>(smem + Sm::kP);
  float* o_s = reinterpret_cast<float*>(smem + Sm::kO);

  const AttentionWorkItem it = items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int group = p.num_heads / p.num_kv_heads;
  const int rows = it.q_len * group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* table = p.block_table + static_cast<size_t>(it.seq) * p.max_blocks_per_seq;
  constexpr int kVecPerRow = HD / 8;

  // Q rows (zeros past `rows`), and a zeroed output tile.
  for (int e = threadIdx.x; e < kRows * kVecPerRow; e += kThreads) {
    const int r = e / kVecPerRow, c = (e % kVecPerRow) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows) {
      const int tok = it.q_row + r / group, head = kvh * group + r % group;
      v = *reinterpret_cast<const uint4*>(p.q + (static_cast<size_t>(tok) * p.num_heads + head) * HD + c);
    }
    *reinterpret_cast<uint4*>(q_s + r * Sm::kLdH + c) = v;
  }
  for (int e = threadIdx.x; e < kRows * HD; e += kThreads) o_s[(e / HD) * Sm::kLdO + e % HD] = 0.0f;

  // Softmax state: lanes 2i and 2i+1 share row 16 * warp + i, each holding half of its columns.
  const int my_row = warp * 16 + lane / 2, half = lane % 2;
  const int my_qpos = my_row < rows ? p.positions[it.q_row + my_row / group] : -1;
  float m = -INFINITY, l = 0.0f;

  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qa[HD / 16];
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) wmma::load_matrix_sync(qa[k], q_s + warp * 16 * Sm::kLdH + k * 16, Sm::kLdH);

  for (int t0 = it.kv_begin; t0 < it.kv_end; t0 += kKeys) {
    __syncthreads();  // every warp is done with the previous K/V tile
    for (int e = threadIdx.x; e < kKeys * kVecPerRow; e += kThreads) {
      const int j = e / kVecPerRow, c = (e % kVecPerRow) * 8;
      const int pos = t0 + j;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (pos < it.kv_end) {
        const int block = table[pos / p.block_size];
        const size_t off =
            ((static_cast<size_t>(block) * p.block_size + pos % p.block_size) * p.num_kv_heads + kvh) * HD + c;
        kv = *reinterpret_cast<const uint4*>(p.k_cache + off);
        vv = *reinterpret_cast<const uint4*>(p.v_cache + off);
      }
      *reinterpret_cast<uint4*>(k_s + j * Sm::kLdH + c) = kv;
      *reinterpret_cast<uint4*>(v_s + j * Sm::kLdH + c) = vv;
    }
    __syncthreads();

    // S (16 rows x 64 keys for this warp) = Q K^T.
#pragma unroll
    for (int n = 0; n < kKeys / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int k = 0; k < HD / 16; ++k) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kb;
        wmma::load_matrix_sync(kb, k_s + n * 16 * Sm::kLdH + k * 16, Sm::kLdH);
        wmma::mma_sync(acc, qa[k], kb, acc);
      }
      wmma::store_matrix_sync(s_s + warp * 16 * Sm::kLdS + n * 16, acc, Sm::kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax over this row's 32 columns of the tile, combined with the partner lane.
    float* srow = s_s + my_row * Sm::kLdS + half * 32;
    float tile_max = -INFINITY;
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const int key = t0 + half * 32 + c;
      const bool valid = key < it.kv_end && key <= my_qpos;
      const float sc = valid ? srow[c] * p.scale : -INFINITY;
      srow[c] = sc;
      tile_max = fmaxf(tile_max, sc);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float alpha = m == -INFINITY ? 0.0f : __expf(m - m_new);
    __nv_bfloat16* prow = p_s + my_row * Sm::kLdP + half * 32;
    float sum = 0.0f;
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const float pe = srow[c] == -INFINITY ? 0.0f : __expf(srow[c] - m_new);
      sum += pe;
      prow[c] = __float2bfloat16_rn(pe);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    float* orow = o_s + my_row * Sm::kLdO + half * (HD / 2);
#pragma unroll 8
    for (int c = 0; c < HD / 2; ++c) orow[c] *= alpha;
    __syncwarp();

    // O (16 rows x HD) += P V.
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      float* o_tile = o_s + warp * 16 * Sm::kLdO + n * 16;
      wmma::load_matrix_sync(acc, o_tile, Sm::kLdO, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < kKeys / 16; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vb;
        wmma::load_matrix_sync(pa, p_s + warp * 16 * Sm::kLdP + k * 16, Sm::kLdP);
        wmma::load_matrix_sync(vb, v_s + k * 16 * Sm::kLdH + n * 16, Sm::kLdH);
        wmma::mma_sync(acc, pa, vb, acc);
      }
      wmma::store_matrix_sync(o_tile, acc, Sm::kLdO, wmma::mem_row_major);
    }
    __syncwarp();
  }

  if (my_row >= rows) return;
  const int tok = it.q_row + my_row / group, head = kvh * group + my_row % group;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  const float* orow = o_s + my_row * Sm::kLdO + half * (HD / 2);
  if (it.partial < 0) {
    __nv_bfloat16* o = p.out + (static_cast<size_t>(tok) * p.num_heads + head) * HD + half * (HD / 2);
    for (int c = 0; c < HD / 2; ++c) o[c] = __float2bfloat16_rn(orow[c] * inv);
  } else {
    const size_t slot = static_cast<size_t>(it.partial) * p.num_heads + head;
    float* o = p.partial_out + slot * HD + half * (HD / 2);
    for (int c = 0; c < HD / 2; ++c) o[c] = orow[c] * inv;
    if (half == 0) {
      p.partial_ml[slot * 2] = m;
      p.partial_ml[slot * 2 + 1] = l;
    }
  }
}

template <int HD>
cudaError_t launch_tc(const PagedAttentionParams& p, const AttentionWorkItem* items, int num_items,
                      cudaStream_t stream) {
  constexpr size_t kBytes = TcSmem<HD>::kBytes;
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(prefill_attention_tc_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kBytes));
  });
  if (attr_err != cudaSuccess) return attr_err;
  dim3 grid(num_items, p.num_kv_heads);
  prefill_attention_tc_kernel<HD><<<grid, kThreads, kBytes, stream>>>(p, items);
  return cudaGetLastError();
}

}  // namespace

cudaError_t prefill_attention_tc(const PagedAttentionParams& p, const AttentionWorkItem* items,
                                 int num_items, cudaStream_t stream) {
  if (!aligned16(p.q)) return cudaErrorMisalignedAddress;
  switch (p.head_dim) {
    case 32: return launch_tc<32>(p, items, num_items, stream);
    case 64: return launch_tc<64>(p, items, num_items, stream);
    case 128: return launch_tc<128>(p, items, num_items, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace hr::kernels::internal
