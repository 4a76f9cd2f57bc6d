// Sampling.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

namespace hr::engine {

namespace {

// Greedy sampling (ties go to the lowest id), or nullopt when `p` samples at random.
std::optional<int32_t> greedy(const float* logits, int vocab, const SamplingParams& p) {
  if (p.temperature > 0.0f && p.top_k != 1) return std::nullopt;
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

}  // namespace

int32_t sample_token(const float* logits, int vocab, const SamplingParams& p, std::mt19937_64& rng) {
  if (auto token = greedy(logits, vocab, p)) return *token;
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  int k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (k < vocab) {
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
    idx.resize(static_cast<size_t>(k));
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  std::vector<double> probs(idx.size());
  double mx = logits[idx[0]];
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    probs[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
    sum += probs[i];
  }
  size_t keep = idx.size();
  if (p.top_p < 1.0f) {
    double acc = 0;
    for (size_t i = 0; i < idx.size(); ++i) {
      acc += probs[i] / sum;
      if (acc >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = std::accumulate(probs.begin(), probs.begin() + static_cast<long>(keep), 0.0);
  double r = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (size_t i = 0; i < keep; ++i) {
    r -= probs[i];
    if (r <= 0) return idx[i];
  }
  return idx[keep - 1];
}

int32_t sample_token(const float* logits, int vocab, const SampleSpec& spec) {
  SamplingParams p;
  p.temperature = spec.temperature;
  p.top_p = spec.top_p;
  p.top_k = spec.top_k;
  if (auto token = greedy(logits, vocab, p)) return *token;  // without seeding a generator
  std::mt19937_64 rng(spec.random);
  return sample_token(logits, vocab, p, rng);
}

}  // namespace hr::engine
