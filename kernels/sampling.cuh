// Token sampling on the GPU, one block per logits row, so that only token ids come back to the
// host. A row's penalties for tokens already seen, then its logit biases, are applied to its
// logits first, in place (the expression of engine::penalized_logit), then a constraint's token
// bitmask. Then greedy (temperature
// <= 0, NaN, infinite or too small to invert in a float, or top_k == 1; ties go to the lowest id),
// or temperature with top-k and top-p. The kept set is everything at or above a threshold found by
// a search over the row's own values (internal/threshold_search.h; top-k: the k highest logits;
// top-p: the smallest highest-probability set whose mass reaches top_p; ties at the threshold are
// all kept), and the draw walks the kept tokens in id order with a uniform number derived from the
// row's 64-bit `random` (same inputs, same token).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hr::kernels {

// A token a sequence has seen and how often it was generated (0: only in the prompt).
struct PenaltyToken {
  int32_t token = 0;
  int32_t count = 0;
};

constexpr int kMaxTopLogprobs = 20;

// A row's sampled token's log probability and the top_ids' (engine::TokenLogprobs' layout).
struct TokenLogprobs {
  float logprob = 0.0f;
  int32_t num_top = 0;
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};

// A bias added to one token's logit.
struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;
};

struct SampleParams {
  float temperature = 0.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0: no limit
  // The token row whose input token (input_ids) also counts as generated once more; -1: none.
  int32_t input_row = -1;
  uint64_t random = 0;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t num_penalty_tokens = 0;
  // The row's seen tokens (device memory): num_penalty_tokens distinct ids. A pointer rather than
  // an offset, so that the lists may live in a buffer of their own that grows without moving
  // anything a captured graph points at.
  const PenaltyToken* penalty_tokens = nullptr;
  // Biases added to the logits after the penalties: num_logit_bias distinct tokens (device memory).
  const LogitBias* logit_bias = nullptr;
  int32_t num_logit_bias = 0;
  // A constraint's allowed tokens (device memory, bit t of word t / 32), or null for all: every
  // other token's logit becomes -inf after the penalties and biases.
  const uint32_t* allowed = nullptr;
  // -1: no log probabilities; else the sampled token's, with this many of the most likely tokens
  // (at most kMaxTopLogprobs) and theirs: log-softmax of the penalized logits at temperature 1.
  int32_t logprobs = -1;
};

// logits: [num_rows, vocab] fp32, changed in place by rows with penalties; params: [num_rows];
// tokens: [num_rows]. input_ids (the step's input token per token row, as the embedding gather
// resolved them) is read only by rows with penalties and an input_row (may be null when none
// has). logprobs: [num_rows], written only for rows asking (may be null when none does). NaN
// logits are never picked; a row of nothing but NaN gets token -1 (and log probability NaN).
cudaError_t sample_tokens(float* logits, int num_rows, int vocab, const SampleParams* params,
                          const int32_t* input_ids, int32_t* tokens, TokenLogprobs* logprobs,
                          cudaStream_t stream);

}  // namespace hr::kernels
