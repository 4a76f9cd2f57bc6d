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

struct AttentionPlan {
  std::vector<kernels::AttentionWorkItem> decode;   // for the decode kernel
  std::vector<kernels::AttentionWorkItem> prefill;  // for the prefill kernel
  std::vector<kernels::AttentionCombineItem> combine;
  int num_partials = 0;
};

struct AttentionPlanParams {
  int num_heads = 0;
  int num_kv_heads = 0;
  int num_sms = 1;        // the GPU's multiprocessors: splits aim at two blocks per multiprocessor
  int max_partials = 0;   // capacity of the partial-result buffers
  // Every decoding sequence gets the same number of splits, whatever its length (some may be
  // empty), so that the item counts depend on the batch size alone (CUDA graph replay).
  bool fixed_splits = false;
  // Decoding tokens go to the tensor-core kernel too (with the prefill items), not the decode kernel.
  bool tensor_core_decode = false;
};

// Fills `plan` (cleared first) for the step. Errors for a sequence without tokens.
[[nodiscard]] Status plan_attention(const StepInput& in, const AttentionPlanParams& p, AttentionPlan* plan);

}  // namespace hr::engine
