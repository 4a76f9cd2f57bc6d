// Tensor-core building blocks for the attention kernels (internal to kernels/): cp.async copies
// into shared memory, ldmatrix fragment loads, the mma.sync m16n8k16 bf16 product, the gather of a
// key tile from the paged cache, and the online softmax over a tile of score fragments.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/paged_attention.cuh"

namespace hr::kernels::internal {

// Each wrapper has a stand-in on the CPU stand-in for the CUDA runtime (simt/, where
// HEADROOM_SIMT is defined) that follows the instruction's documented semantics.
#if defined(HEADROOM_SIMT)

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  ::hr::simt::cp_async16(dst, src, valid);
}
__device__ __forceinline__ void cp_async_commit() { ::hr::simt::cp_async_commit(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  ::hr::simt::cp_async_wait(N);
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  ::hr::simt::ldmatrix_x4(r, p, false);
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  ::hr::simt::ldmatrix_x4(r, p, true);
}
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  ::hr::simt::mma16816(c, a, b0, b1);
}

#else

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups of this thread's copies are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col).
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Keys [t0, t0 + kAttentionTcKeyTile) of KV head kvh, gathered through the block table into
// shared-memory tiles of rows HD + 8 bf16 wide (zeros past kv_end), by THREADS threads.
template <int HD, int THREADS>
__device__ __forceinline__ void load_kv_tile(const PagedAttentionParams& p, const int32_t* table,
                                             int kvh, int t0, int kv_end, __nv_bfloat16* k_s,
                                             __nv_bfloat16* v_s) {
  constexpr int kLd = HD + 8;
  constexpr int kVecPerRow = HD / 8;
  for (int e = threadIdx.x; e < kAttentionTcKeyTile * kVecPerRow; e += THREADS) {
    const int j = e / kVecPerRow, c = (e % kVecPerRow) * 8;
    const int pos = t0 + j;
    const bool valid = pos < kv_end;
    size_t off = 0;
    if (valid) {
      const int block = table[pos / p.block_size];
      off = ((static_cast<size_t>(block) * p.block_size + pos % p.block_size) * p.num_kv_heads +
             kvh) *
                HD +
            c;
    }
    cp_async16(k_s + j * kLd + c, p.k_cache + off, valid);
    cp_async16(v_s + j * kLd + c, p.v_cache + off, valid);
  }
}

// One key tile's step of the online softmax for the two rows of an m16 tile a lane holds (a: lane
// / 4, b: lane / 4 + 8), given N 16x8 score fragments s (from mma16816) whose first key is key0:
// keys at or past kv_end or after the row's query position are masked, scores scaled, and s
// becomes the tile's probabilities relative to the new running maxima m_a, m_b; the sums l_a, l_b
// are rescaled and grown, and alpha_a, alpha_b are what the output accumulators must be scaled by.
// A lane quad shares its rows.
template <int N>
__device__ __forceinline__ void online_softmax_tile(float (&s)[N][4], int key0, int kv_end,
                                                    int qpos_a, int qpos_b, float scale, float& m_a,
                                                    float& m_b, float& l_a, float& l_b,
                                                    float& alpha_a, float& alpha_b) {
  const int lane = threadIdx.x % 32;
  float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int key = key0 + n * 8 + (lane % 4) * 2;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool ok = key + e < kv_end;
      s[n][e] = ok && key + e <= qpos_a ? s[n][e] * scale : -INFINITY;
      s[n][2 + e] = ok && key + e <= qpos_b ? s[n][2 + e] * scale : -INFINITY;
      mx_a = fmaxf(mx_a, s[n][e]);
      mx_b = fmaxf(mx_b, s[n][2 + e]);
    }
  }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
  }
  const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
  alpha_a = m_a == -INFINITY ? 0.0f : __expf(m_a - mn_a);
  alpha_b = m_b == -INFINITY ? 0.0f : __expf(m_b - mn_b);
  float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s[n][e] = s[n][e] == -INFINITY ? 0.0f : __expf(s[n][e] - mn_a);
      s[n][2 + e] = s[n][2 + e] == -INFINITY ? 0.0f : __expf(s[n][2 + e] - mn_b);
      sum_a += s[n][e];
      sum_b += s[n][2 + e];
    }
  }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    sum_a += __shfl_xor_sync(0xffffffffu, sum_a, off);
    sum_b += __shfl_xor_sync(0xffffffffu, sum_b, off);
  }
  l_a = l_a * alpha_a + sum_a;
  l_b = l_b * alpha_b + sum_b;
  m_a = mn_a;
  m_b = mn_b;
}

}  // namespace hr::kernels::internal
