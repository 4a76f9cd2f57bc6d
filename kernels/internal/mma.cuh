// Tensor-core building blocks for the attention kernels (internal to kernels/): cp.async copies
// into shared memory, ldmatrix fragment loads, the mma.sync m16n8k16 bf16 product, and the gather
// of a key tile from the paged cache.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/paged_attention.cuh"

namespace hr::kernels::internal {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
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

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Keys [t0, t0 + kAttentionTcKeyTile) of KV head kvh, gathered through the block table into
// shared-memory tiles of rows HD + 8 bf16 wide (zeros past kv_end), by THREADS threads.
template <int HD, int THREADS>
__device__ __forceinline__ void load_kv_tile(const PagedAttentionParams& p, const int32_t* table, int kvh, int t0,
                                             int kv_end, __nv_bfloat16* k_s, __nv_bfloat16* v_s) {
  constexpr int kLd = HD + 8;
  constexpr int kVecPerRow = HD / 8;
  for (int e = threadIdx.x; e < kAttentionTcKeyTile * kVecPerRow; e += THREADS) {
    const int j = e / kVecPerRow, c = (e % kVecPerRow) * 8;
    const int pos = t0 + j;
    const bool valid = pos < kv_end;
    size_t off = 0;
    if (valid) {
      const int block = table[pos / p.block_size];
      off = ((static_cast<size_t>(block) * p.block_size + pos % p.block_size) * p.num_kv_heads + kvh) * HD + c;
    }
    cp_async16(k_s + j * kLd + c, p.k_cache + off, valid);
    cp_async16(v_s + j * kLd + c, p.v_cache + off, valid);
  }
}

}  // namespace hr::kernels::internal
