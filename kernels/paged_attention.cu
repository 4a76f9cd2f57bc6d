// Paged attention. Items go to the tensor-core prefill kernel (prefill_attention_tc.cu), the
// tensor-core decode kernel (decode_attention_tc.cu), or the CUDA-core decode kernel here: a block
// of 4 warps per (work item, KV head). Rows r = token * group + head
// within the group; warp w owns rows w, w + 4, ... and keeps their running max, sum and output
// accumulators in registers (lane owns dims lane, lane + 32, ...). K/V tiles are staged in shared
// memory as fp32; the next tile's 16-byte loads are issued before the current tile is computed.
#include "kernels/internal/attention_launch.cuh"
#include "kernels/internal/common.cuh"
#include "kernels/internal/decode_attention_tc.cuh"
#include "kernels/internal/prefill_attention_tc.cuh"
#include "kernels/internal/split_combine.cuh"
#include "kernels/paged_attention.cuh"

namespace hr::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = kAttentionKeyTile;

template <int HD, int RPW>
struct AttentionSmem {
  static constexpr int kRows = kWarps * RPW;
  static constexpr int kQ = kRows * HD;
  static constexpr int kK = kTile * (HD + 1);  // padded: lanes read different rows
  static constexpr int kV = kTile * HD;
  static constexpr int kP = kRows * kTile;
  static constexpr size_t kBytes = sizeof(float) * (kQ + kK + kV + kP);
};

template <int HD>
struct KvTileLoader {
  static constexpr int kVecPerRow = HD / 8;
  static constexpr int kVecs = kTile * kVecPerRow;
  static constexpr int kPerThread = (kVecs + kThreads - 1) / kThreads;
  uint4 k[kPerThread];
  uint4 v[kPerThread];

  __device__ void load(const PagedAttentionParams& p, const int32_t* table, int kvh, int t0,
                       int kv_end) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = threadIdx.x + i * kThreads;
      const int j = e / kVecPerRow, c = (e % kVecPerRow) * 8;
      const int pos = t0 + j;
      if (e < kVecs && pos < kv_end) {
        const int block = table[pos / p.block_size];
        const size_t off =
            ((static_cast<size_t>(block) * p.block_size + pos % p.block_size) * p.num_kv_heads +
             kvh) *
                HD +
            c;
        k[i] = *reinterpret_cast<const uint4*>(p.k_cache + off);
        v[i] = *reinterpret_cast<const uint4*>(p.v_cache + off);
      } else {
        k[i] = make_uint4(0, 0, 0, 0);
        v[i] = make_uint4(0, 0, 0, 0);
      }
    }
  }

  __device__ void store(float* k_s, float* v_s) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = threadIdx.x + i * kThreads;
      if (e >= kVecs) continue;
      const int j = e / kVecPerRow, c = (e % kVecPerRow) * 8;
      float f[8];
      internal::bf16x8_to_float(k[i], f);
#pragma unroll
      for (int q = 0; q < 8; ++q) k_s[j * (HD + 1) + c + q] = f[q];
      internal::bf16x8_to_float(v[i], f);
#pragma unroll
      for (int q = 0; q < 8; ++q) v_s[j * HD + c + q] = f[q];
    }
  }
};

template <int HD, int RPW>
__global__ void __launch_bounds__(kThreads)
    paged_attention_kernel(PagedAttentionParams p, const AttentionWorkItem* items) {
  internal::pdl_wait();
  using Smem = AttentionSmem<HD, RPW>;
  constexpr int kDpl = HD / 32;  // output dims per lane
  HR_DYNAMIC_SMEM(float, smem, alignof(float));
  float* q_s = smem;
  float* k_s = q_s + Smem::kQ;
  float* v_s = k_s + Smem::kK;
  float* p_s = v_s + Smem::kV;

  const AttentionWorkItem it = items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int group = p.num_heads / p.num_kv_heads;
  const int rows = it.q_len * group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* table = p.block_table + static_cast<size_t>(it.seq) * p.max_blocks_per_seq;

  KvTileLoader<HD> loader;
  loader.load(p, table, kvh, it.kv_begin, it.kv_end);

  for (int e = threadIdx.x; e < rows * HD; e += kThreads) {
    const int r = e / HD, d = e % HD;
    const int tok = it.q_row + r / group, head = kvh * group + r % group;
    q_s[e] =
        __bfloat162float(p.q[(static_cast<size_t>(tok) * p.num_heads + head) * HD + d]) * p.scale;
  }

  float m[RPW], l[RPW], acc[RPW][kDpl];
  int qpos[RPW];
#pragma unroll
  for (int jr = 0; jr < RPW; ++jr) {
    const int r = warp + kWarps * jr;
    m[jr] = -INFINITY;
    l[jr] = 0.0f;
    qpos[jr] = r < rows ? p.positions[it.q_row + r / group] : -1;
#pragma unroll
    for (int dd = 0; dd < kDpl; ++dd) acc[jr][dd] = 0.0f;
  }

  for (int t0 = it.kv_begin; t0 < it.kv_end; t0 += kTile) {
    __syncthreads();  // the previous tile's K/V/P are no longer read
    loader.store(k_s, v_s);
    __syncthreads();
    if (t0 + kTile < it.kv_end) loader.load(p, table, kvh, t0 + kTile, it.kv_end);

    const int key = t0 + lane;
    float s[RPW];
#pragma unroll
    for (int jr = 0; jr < RPW; ++jr) s[jr] = 0.0f;
    const float* k_row = k_s + lane * (HD + 1);
#pragma unroll 8
    for (int d = 0; d < HD; ++d) {
      const float kd = k_row[d];
#pragma unroll
      for (int jr = 0; jr < RPW; ++jr) {
        const int r = warp + kWarps * jr;
        if (r < rows) s[jr] += q_s[r * HD + d] * kd;
      }
    }
#pragma unroll
    for (int jr = 0; jr < RPW; ++jr) {
      const int r = warp + kWarps * jr;
      if (r >= rows) continue;  // uniform across the warp
      const bool valid = key < it.kv_end && key <= qpos[jr];
      const float sc = valid ? s[jr] : -INFINITY;
      const float m_new = fmaxf(m[jr], internal::warp_max(sc));
      const float pe = valid ? __expf(sc - m_new) : 0.0f;
      const float alpha = m[jr] == -INFINITY ? 0.0f : __expf(m[jr] - m_new);
      l[jr] = l[jr] * alpha + internal::warp_sum(pe);
      m[jr] = m_new;
      p_s[r * kTile + lane] = pe;
#pragma unroll
      for (int dd = 0; dd < kDpl; ++dd) acc[jr][dd] *= alpha;
    }
    __syncwarp();
#pragma unroll 4
    for (int j = 0; j < kTile; ++j) {
      float v[kDpl];
#pragma unroll
      for (int dd = 0; dd < kDpl; ++dd) v[dd] = v_s[j * HD + lane + 32 * dd];
#pragma unroll
      for (int jr = 0; jr < RPW; ++jr) {
        const int r = warp + kWarps * jr;
        if (r >= rows) continue;
        const float pj = p_s[r * kTile + j];
#pragma unroll
        for (int dd = 0; dd < kDpl; ++dd) acc[jr][dd] += pj * v[dd];
      }
    }
  }
  internal::pdl_launch_dependents();  // only the epilogue is left

#pragma unroll
  for (int jr = 0; jr < RPW; ++jr) {
    const int r = warp + kWarps * jr;
    if (r >= rows) continue;
    const int tok = it.q_row + r / group, head = kvh * group + r % group;
    const float inv = l[jr] > 0.0f ? 1.0f / l[jr] : 0.0f;
    if (it.partial < 0) {
      __nv_bfloat16* o = p.out + (static_cast<size_t>(tok) * p.num_heads + head) * HD;
#pragma unroll
      for (int dd = 0; dd < kDpl; ++dd) o[lane + 32 * dd] = __float2bfloat16_rn(acc[jr][dd] * inv);
    } else {
      const size_t slot = static_cast<size_t>(it.partial) * p.num_heads + head;
      float* o = p.partial_out + slot * HD;
#pragma unroll
      for (int dd = 0; dd < kDpl; ++dd) o[lane + 32 * dd] = acc[jr][dd] * inv;
      if (lane == 0) {
        p.partial_ml[slot * 2] = m[jr];
        p.partial_ml[slot * 2 + 1] = l[jr];
      }
    }
  }
  if (it.partial >= 0 && p.combine_counters) internal::merge_if_last_split(p, it, kvh, group);
}

// One warp per (combine item, head).
__global__ void paged_attention_combine_kernel(PagedAttentionParams p,
                                               const AttentionCombineItem* items) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  internal::merge_head(p, items[blockIdx.x], blockIdx.y);
}

}  // namespace

cudaError_t paged_attention(const PagedAttentionParams& p, const AttentionWorkItem* items,
                            int num_items, AttentionKernel kernel, cudaStream_t stream) {
  if (num_items < 0 || p.num_heads <= 0 || p.num_kv_heads <= 0 ||
      p.num_heads % p.num_kv_heads != 0 || p.block_size <= 0 || p.max_blocks_per_seq <= 0) {
    return cudaErrorInvalidValue;
  }
  if (!p.q || !p.k_cache || !p.v_cache || !p.block_table || !p.positions || !p.out || !items) {
    return cudaErrorInvalidValue;
  }
  if ((p.combine_counters != nullptr) != (p.combine_items != nullptr)) return cudaErrorInvalidValue;
  if (!internal::aligned16(p.k_cache) || !internal::aligned16(p.v_cache))
    return cudaErrorMisalignedAddress;
  if (num_items == 0) return cudaSuccess;
  const int group = p.num_heads / p.num_kv_heads;
  switch (kernel) {
    case AttentionKernel::kPrefill:
      if (group > kAttentionPrefillRows) return cudaErrorInvalidValue;
      return internal::prefill_attention_tc(p, items, num_items, stream);
    case AttentionKernel::kDecodeTc:
      if (group > kAttentionDecodeTcRows) return cudaErrorInvalidValue;
      return internal::decode_attention_tc(p, items, num_items, stream);
    case AttentionKernel::kDecode: {
      if (group > kAttentionDecodeRows) return cudaErrorInvalidValue;
      constexpr int kRpw = kAttentionDecodeRows / kWarps;
      return internal::for_head_dim(p.head_dim, [&](auto hd) {
        constexpr int HD = decltype(hd)::value;
        return internal::launch_attention<paged_attention_kernel<HD, kRpw>>(
            p, items, num_items, kThreads, AttentionSmem<HD, kRpw>::kBytes, stream);
      });
    }
  }
  return cudaErrorInvalidValue;
}

cudaError_t paged_attention_combine(const PagedAttentionParams& p,
                                    const AttentionCombineItem* items, int num_items,
                                    cudaStream_t stream) {
  if (num_items < 0 || !p.partial_out || !p.partial_ml || !p.out || p.num_heads <= 0 ||
      p.head_dim <= 0 || p.head_dim % 32 != 0 || p.head_dim > 32 * internal::kMaxMergeDims) {
    return cudaErrorInvalidValue;
  }
  if (num_items == 0) return cudaSuccess;
  dim3 grid(num_items, p.num_heads);
  return internal::launch(paged_attention_combine_kernel, grid, dim3(32), 0, stream, p, items);
}

}  // namespace hr::kernels
