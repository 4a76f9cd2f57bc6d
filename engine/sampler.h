// Token sampling from one row of logits: greedy, temperature, top-k, top-p, with a per-sequence
// random generator (seeded requests are reproducible). Pure function of its inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace hr::engine {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  float top_p = 1.0f;
  int top_k = 0;             // 0: no limit
  std::optional<uint64_t> seed;
  int max_tokens = 256;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
};

int32_t sample_token(const float* logits, int vocab, const SamplingParams& params,
                     std::mt19937_64& rng);

// How one logits row is sampled inside a backend: the sequence's parameters and 64 bits drawn from
// its generator for this step (the same spec gives the same token).
struct SampleSpec {
  float temperature = 0.0f;  // <= 0: greedy
  float top_p = 1.0f;
  int top_k = 0;
  uint64_t random = 0;
};

// sample_token with the spec's parameters and a generator seeded from its random bits.
int32_t sample_token(const float* logits, int vocab, const SampleSpec& spec);

}  // namespace hr::engine
