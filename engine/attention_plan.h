// How one step's attention is cut into kernel work items (kernels/paged_attention.cuh): decoding
// sequences become one item each, split over the key range (flash-decoding) when there are too few
// of them to fill the GPU; prefill chunks become tiles of up to 128 / group query tokens, longest
// first. Pure host code, shared by the CUDA backend and the kernel tests.
#pragma once

#include <vector>

#include "base/status.h"
#include "engine/backend.h"
#include "kernels/paged_attention.cuh"

namespace hr::engine {

// Where decoding tokens' attention runs.
enum class DecodeAttention {
  kCudaCore,      // the CUDA-core decode kernel
  kPrefillTiles,  // with the prefill items, in the tensor-core prefill kernel's 128-row tiles
  kTensorCore,    // the tensor-core decode kernel: one 16-row tile, the keys shared out among warps
};

struct AttentionPlan {
  std::vector<kernels::AttentionWorkItem> decode;  // for decode_kernel
  kernels::AttentionKernel decode_kernel = kernels::AttentionKernel::kDecode;
  std::vector<kernels::AttentionWorkItem> prefill;  // for the prefill kernel
  std::vector<kernels::AttentionCombineItem> combine;
  int num_partials = 0;
};

// The most splits a decoding sequence gets (see plan_attention).
constexpr int kMaxDecodeSplits = 16;

struct AttentionPlanParams {
  int num_heads = 0;
  int num_kv_heads = 0;
  int num_sms = 1;       // the GPU's multiprocessors: splits aim at two blocks per multiprocessor
  int max_partials = 0;  // capacity of the partial-result buffers
  // Every decoding sequence gets the same number of splits, whatever its length (some may be
  // empty), so that the item counts depend on the batch size alone (CUDA graph replay).
  bool fixed_splits = false;
  // The kernel for decoding tokens; the prefill kernel takes them when their group of heads is
  // more than the chosen kernel's tile holds.
  DecodeAttention decode = DecodeAttention::kCudaCore;
};

// Fills `plan` (cleared first) for the step. Errors for a sequence without tokens.
[[nodiscard]] Status plan_attention(const StepInput& in, const AttentionPlanParams& p,
                                    AttentionPlan* plan);

}  // namespace hr::engine
