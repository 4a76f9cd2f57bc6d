// Mixture-of-experts routing on the host: router scores to each token's top-k experts and their
// weights, as the models compute it. The CPU backend's routing and the reference the CUDA routing
// kernel is checked against. Stateless; thread-safe.
#pragma once

#include <cstdint>

#include "engine/model_config.h"

namespace hr::engine {

// For each of `num_tokens` rows of router logits [num_tokens, num_experts]: the top_k experts in
// order of score (ties to the lower id), and the weight each one's output gets.
// - kSoftmax (Mixtral, Qwen3-MoE): softmax over every expert in fp32, the top k of it,
//   renormalised to sum to 1 where `renormalize`.
// - kSigmoid (DeepSeek-V3): sigmoid scores; with `bias` (e_score_correction_bias, [num_experts];
//   may be null) added for the choice only; experts in num_groups groups, each group scored by
//   the sum of its two best, the top k chosen within the topk_groups best groups; the weights are
//   the unbiased scores, renormalised where `renormalize`.
// Then every weight is multiplied by routed_scaling_factor.
// `experts` and `weights` are [num_tokens, top_k].
void route_tokens(const float* logits, int num_tokens, const MoeConfig& moe, const float* bias,
                  int32_t* experts, float* weights);

}  // namespace hr::engine
