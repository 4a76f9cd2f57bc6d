// MoE routing configurations the routing tests share (the host reference's and the kernels').
#pragma once

#include "engine/model_config.h"

namespace hr::engine {

// Softmax scores, the top k of `experts` (Qwen3-MoE renormalizes the k weights, Mixtral not).
inline MoeConfig softmax_moe(int experts, int k, bool renormalize) {
  MoeConfig m;
  m.num_experts = experts;
  m.top_k = k;
  m.renormalize = renormalize;
  return m;
}

// DeepSeek-V3's form: sigmoid scores, the top k within the `topk_groups` best of `groups` groups,
// renormalized and scaled.
inline MoeConfig sigmoid_grouped_moe(int experts, int k, int groups, int topk_groups,
                                     float scaling) {
  MoeConfig m = softmax_moe(experts, k, true);
  m.scoring = RouterScoring::kSigmoid;
  m.num_groups = groups;
  m.topk_groups = topk_groups;
  m.routed_scaling_factor = scaling;
  return m;
}

}  // namespace hr::engine
