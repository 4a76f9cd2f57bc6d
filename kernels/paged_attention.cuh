// Paged attention over the flattened batch, flash-attention style: each work item is one query
// tile of one sequence (a prefill chunk of up to 128 / group tokens, or one decoding token), run
// for one KV head with all the query heads of its GQA group, streaming K/V tiles through the block
// table with an online softmax: prefill tiles on tensor cores; decodes on the CUDA-core decode
// kernel, on the tensor-core decode kernel (a 16-row tile, the keys shared out among warps), or,
// routed with the prefill items, on the prefill kernel. Causal: a query at position p sees
// positions <= p.
// Long decodes are split over the key range (flash-decoding): each split writes a partial result
// that paged_attention_combine merges, or that the last split to finish merges itself (when
// PagedAttentionParams::combine_counters is set: one kernel fewer per layer).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace hr::kernels {

struct AttentionWorkItem {
  int32_t seq;       // row of block_table
  int32_t q_row;     // first query token row of the flattened batch
  int32_t q_len;     // query tokens in this item
  int32_t kv_begin;  // first key position read
  int32_t kv_end;    // one past the last key position read (<= last query position + 1)
  int32_t partial;   // -1: write out; else this split's slot in partial_out (then q_len == 1)
  int32_t combine;   // with partial >= 0: the index of this token's AttentionCombineItem
};

struct AttentionCombineItem {
  int32_t q_row;  // token row of the flattened batch
  int32_t
      first_partial;  // its splits occupy partial slots [first_partial, first_partial + num_splits)
  int32_t num_splits;
};

struct PagedAttentionParams {
  const __nv_bfloat16* q = nullptr;        // [num_tokens, num_heads, head_dim], rotated
  const __nv_bfloat16* k_cache = nullptr;  // [num_blocks * block_size, num_kv_heads, head_dim]
  const __nv_bfloat16* v_cache = nullptr;  // same
  const int32_t* block_table = nullptr;    // [num_seqs, max_blocks_per_seq]
  const int32_t* positions = nullptr;      // [num_tokens]
  __nv_bfloat16* out = nullptr;            // [num_tokens, num_heads, head_dim]
  float* partial_out = nullptr;            // [num_partials, num_heads, head_dim], normalised
  float* partial_ml = nullptr;             // [num_partials, num_heads, 2]: running max, sum
  // Set both to merge the splits inside paged_attention: the step's combine items, and one
  // counter per (combine item, KV head), zero before the launch and left at zero after it.
  const AttentionCombineItem* combine_items = nullptr;
  int32_t* combine_counters = nullptr;
  int max_blocks_per_seq = 0;
  int block_size = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // 32, 64 or 128
  float scale = 0.0f;
};

// The kernels, and the rows (query tokens x group heads) a work item may hold in each.
enum class AttentionKernel {
  kPrefill,   // tensor cores, 128-row tiles: prefill items and decode items alike
  kDecode,    // CUDA cores, decode items (q_len == 1) of up to kAttentionDecodeRows rows
  kDecodeTc,  // tensor cores, decode items (q_len == 1) of up to kAttentionDecodeTcRows rows
};
constexpr int kAttentionDecodeRows = 8;
constexpr int kAttentionDecodeTcRows = 16;
constexpr int kAttentionPrefillRows = 128;
constexpr int kAttentionKeyTile = 32;    // keys per tile of the CUDA-core decode kernel
constexpr int kAttentionTcKeyTile = 64;  // keys per tile of the tensor-core kernels

// Runs `num_items` work items on `kernel`.
cudaError_t paged_attention(const PagedAttentionParams& p, const AttentionWorkItem* items,
                            int num_items, AttentionKernel kernel, cudaStream_t stream);

// The dynamic shared memory that prefill needs at `head_dim` (the most of any attention kernel);
// 0 for an unsupported head_dim. A device must allow this much per block.
size_t paged_attention_smem_bytes(int head_dim);

// Merges the splits of each combine item into out.
cudaError_t paged_attention_combine(const PagedAttentionParams& p,
                                    const AttentionCombineItem* items, int num_items,
                                    cudaStream_t stream);

}  // namespace hr::kernels
