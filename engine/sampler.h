// Token sampling from one row of logits: penalties for tokens already seen, then greedy,
// temperature, top-k, top-p, with a per-sequence random generator (seeded requests are
// reproducible). Pure functions of their inputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace hr::engine {

// A bias added to one token's logit before sampling (-100 all but bans it, +100 all but forces it).
struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;
};

// OpenAI's penalties over the tokens generated so far: each logit loses `frequency` times its
// token's count, and `presence` once if the token occurs at all. `repetition` (Hugging Face
// transformers' repetition_penalty) over the prompt's and the generated tokens: a positive logit
// is divided by it, a negative one multiplied. Applied first, then frequency and presence.
struct Penalties {
  float frequency = 0.0f;
  float presence = 0.0f;
  float repetition = 1.0f;
  bool any() const { return frequency != 0.0f || presence != 0.0f || repetition != 1.0f; }
};

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  float top_p = 1.0f;
  int top_k = 0;  // 0: no limit
  std::optional<uint64_t> seed;
  Penalties penalties;
  // OpenAI's logit_bias: added to these tokens' logits (after the penalties); distinct tokens.
  std::vector<LogitBias> logit_bias;
  // -1: no log probabilities; else each generated token's, with this many of the most likely
  // tokens at that step and theirs (at most kMaxTopLogprobs).
  int logprobs = -1;
  int max_tokens = 256;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
};

// With top-k or top-p, the kept tokens are sorted by logit and the draw walks them in that order;
// with every token kept, it walks them in id order (as the CUDA kernel does), with no sort.
int32_t sample_token(const float* logits, int vocab, const SamplingParams& params,
                     std::mt19937_64& rng);

inline constexpr int kMaxTopLogprobs = 20;

// A sampled token's log probability, and the most likely tokens' (highest first, ties to the lowest
// id): log-softmax of the logits the sampler chose from, penalties applied, at temperature 1.
struct TokenLogprobs {
  float logprob = 0.0f;
  int num_top = 0;
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};

// A token a sequence has seen: how often it was generated so far (0: it is only in the prompt).
struct PenaltyToken {
  int32_t token = 0;
  int32_t count = 0;
};

// How one logits row is sampled inside a backend: the sequence's parameters and 64 bits drawn from
// its generator for this step (the same spec gives the same token).
struct SampleSpec {
  float temperature = 0.0f;  // <= 0: greedy
  float top_p = 1.0f;
  int top_k = 0;
  uint64_t random = 0;
  // Penalties (SamplingParams) over the distinct tokens penalty_tokens lists; a backend reads
  // the list during submit() only. The prompt's tokens are listed only for repetition_penalty.
  Penalties penalties;
  const PenaltyToken* penalty_tokens = nullptr;
  int num_penalty_tokens = 0;
  // The row's own input token is one more generated token that penalty_tokens does not count
  // yet: the token a pipelined step is fed from the step before, which the host has not seen.
  bool penalize_input = false;
  // As SamplingParams::logprobs: -1, or the number of most likely tokens wanted with the sampled
  // one's log probability.
  int logprobs = -1;
  // SamplingParams::logit_bias, read during submit() only.
  const LogitBias* logit_bias = nullptr;
  int num_logit_bias = 0;
  // A constraint's allowed tokens (bit t of word t / 32), read during submit() only; null: all.
  // Applied after the penalties and biases: every other token's logit becomes -inf.
  const uint32_t* allowed = nullptr;
};

// One token's logit after the penalties, for a token seen `count` times in the output (0: only in
// the prompt). The CUDA sampler computes the same operations, the multiply-add fused on both
// sides so that no compiler setting can round them differently.
inline float penalized_logit(float logit, int count, const Penalties& p) {
  if (p.repetition != 1.0f) logit = logit > 0.0f ? logit / p.repetition : logit * p.repetition;
  if (count > 0) logit -= std::fma(p.frequency, static_cast<float>(count), p.presence);
  return logit;
}

// Applies the spec's penalties, then its logit bias, to one logits row in place. `input_token` is
// the row's input token, counted when spec.penalize_input (ignored when outside [0, vocab)).
void apply_penalties(float* logits, int vocab, const SampleSpec& spec, int32_t input_token);

// Sets the logit of every token not in `allowed` (a bitmask over the row) to -inf.
void apply_token_mask(float* logits, int vocab, const uint32_t* allowed);

// The log probability of `token` (-inf when it is not a token of the row) and of the `top` most
// likely tokens, from one row of (penalized) logits. NaN logits count for nothing.
void token_logprobs(const float* logits, int vocab, int32_t token, int top, TokenLogprobs* out);

// sample_token with the spec's parameters and a generator seeded from its random bits. Penalties
// are not applied here (apply_penalties first).
int32_t sample_token(const float* logits, int vocab, const SampleSpec& spec);

}  // namespace hr::engine
