// RoPE fused with the paged KV write. For each token t of the flattened batch: adds the q/k/v bias
// (when given), RMS-normalises each query and key head (Qwen3's q_norm and k_norm, when given),
// rotates its query heads and key heads (rotate-half layout, inv_freq already holding
// any llama3 scaling), writes the rotated queries to q_out, and writes the key and value heads into
// cache slot slot_mapping[t] (= block * block_size + offset).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace hr::kernels {

struct RopeKvParams {
  const float* qkv = nullptr;             // [num_tokens, (num_heads + 2 num_kv_heads) head_dim]
  const float* bias = nullptr;            // [(num_heads + 2 num_kv_heads) head_dim] or null
  const int32_t* positions = nullptr;     // [num_tokens]
  const int32_t* slot_mapping = nullptr;  // [num_tokens]
  const float* inv_freq = nullptr;        // [head_dim / 2]
  const float* q_norm = nullptr;          // [head_dim] or null (then k_norm is null too)
  const float* k_norm = nullptr;          // [head_dim]
  float eps = 1e-6f;                      // the q/k norms' epsilon
  __nv_bfloat16* q_out = nullptr;         // [num_tokens, num_heads, head_dim]
  __nv_bfloat16* k_cache = nullptr;       // [num_slots, num_kv_heads, head_dim]
  __nv_bfloat16* v_cache = nullptr;       // [num_slots, num_kv_heads, head_dim]
  int num_tokens = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // even
};

cudaError_t rope_write_kv(const RopeKvParams& p, cudaStream_t stream);

}  // namespace hr::kernels
