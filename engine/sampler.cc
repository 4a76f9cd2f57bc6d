// Sampling.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

namespace hr::engine {

namespace {

// The highest logit (ties go to the lowest id); NaN never wins. -1 when every logit is NaN.
int32_t argmax(const float* logits, int vocab) {
  int32_t best = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = i;
  }
  return best;
}

// Greedy sampling, or nullopt when `p` samples at random.
std::optional<int32_t> greedy(const float* logits, int vocab, const SamplingParams& p) {
  if (p.temperature > 0.0f && p.top_k != 1) return std::nullopt;
  return argmax(logits, vocab);
}

}  // namespace

int32_t sample_token(const float* logits, int vocab, const SamplingParams& p,
                     std::mt19937_64& rng) {
  if (auto token = greedy(logits, vocab, p)) return *token;
  // No logit to draw from (all NaN), +inf, which outweighs everything at any temperature, or
  // -inf at most (every token banned): the lowest id of the maximum, as greedy.
  const int32_t top = argmax(logits, vocab);
  if (top < 0 || std::isinf(logits[top])) return top;
  if ((p.top_k <= 0 || p.top_k >= vocab) && p.top_p >= 1.0f) {
    // Every token is kept: the draw walks them in id order (as the CUDA kernel does), with no
    // sort of the whole vocabulary.
    thread_local std::vector<double> weights;
    weights.resize(static_cast<size_t>(vocab));
    const double mx = logits[top];
    double total = 0;
    for (int32_t i = 0; i < vocab; ++i) {
      const double w = std::isnan(logits[i]) ? 0.0 : std::exp((logits[i] - mx) / p.temperature);
      weights[static_cast<size_t>(i)] = w;
      total += w;
    }
    double r = std::uniform_real_distribution<double>(0.0, total)(rng);
    int32_t last = top;
    for (int32_t i = 0; i < vocab; ++i) {
      const double w = weights[static_cast<size_t>(i)];
      if (w <= 0) continue;  // a banned or masked token is never drawn
      last = i;
      r -= w;
      if (r <= 0) return i;
    }
    return last;
  }
  std::vector<int32_t> idx;
  idx.reserve(static_cast<size_t>(vocab));
  for (int32_t i = 0; i < vocab; ++i) {
    if (!std::isnan(logits[i])) idx.push_back(i);
  }
  const int n = static_cast<int>(idx.size());
  int k = p.top_k > 0 ? std::min(p.top_k, n) : n;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (k == n && p.top_p < 1.0f) {
    // Top-p alone: the kept set is the shortest run of the sorted tokens whose mass reaches top_p.
    // It is usually small, so the best few hundred are sorted first; when their mass falls short,
    // only the tokens at or above the logit below which all together weigh at most 1 - top_p are
    // (the kept set is among them), not the whole vocabulary.
    const double mx = logits[top];
    double sum = 0;
    for (int32_t i : idx) sum += std::exp((logits[i] - mx) / p.temperature);
    auto draw = [&](int count) {  // from the first `count` of idx, sorted
      std::vector<double> w(static_cast<size_t>(count));
      for (int j = 0; j < count; ++j)
        w[static_cast<size_t>(j)] =
            std::exp((logits[idx[static_cast<size_t>(j)]] - mx) / p.temperature);
      double acc = 0;
      int keep = count;
      for (int j = 0; j < count; ++j) {
        acc += w[static_cast<size_t>(j)] / sum;
        if (acc >= p.top_p) {
          keep = j + 1;
          break;
        }
      }
      const double total = std::accumulate(w.begin(), w.begin() + keep, 0.0);
      double r = std::uniform_real_distribution<double>(0.0, total)(rng);
      for (int j = 0; j < keep; ++j) {
        r -= w[static_cast<size_t>(j)];
        if (r <= 0) return idx[static_cast<size_t>(j)];
      }
      return idx[static_cast<size_t>(keep - 1)];
    };
    const int m = std::min(n, 256);
    std::partial_sort(idx.begin(), idx.begin() + m, idx.end(), by_logit);
    double head = 0;
    for (int j = 0; j < m; ++j)
      head += std::exp((logits[idx[static_cast<size_t>(j)]] - mx) / p.temperature);
    if (head / sum >= p.top_p || m == n) return draw(m);
    const double floor_logit =
        mx + p.temperature * std::log((1.0 - p.top_p) * sum / static_cast<double>(n));
    const auto end = std::partition(idx.begin() + m, idx.end(),
                                    [&](int32_t i) { return logits[i] >= floor_logit; });
    std::sort(idx.begin() + m, end, by_logit);
    return draw(static_cast<int>(end - idx.begin()));
  }
  if (k < n) {
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

void apply_penalties(float* logits, int vocab, const SampleSpec& spec, int32_t input_token) {
  if (spec.penalties.any()) {
    const int32_t extra =
        spec.penalize_input && input_token >= 0 && input_token < vocab ? input_token : -1;
    bool extra_listed = false;
    for (int i = 0; i < spec.num_penalty_tokens; ++i) {
      const PenaltyToken& p = spec.penalty_tokens[i];
      if (p.token < 0 || p.token >= vocab) continue;
      const bool is_extra = p.token == extra;
      extra_listed = extra_listed || is_extra;
      float& l = logits[p.token];
      l = penalized_logit(l, p.count + (is_extra ? 1 : 0), spec.penalties);
    }
    if (extra >= 0 && !extra_listed) {
      logits[extra] = penalized_logit(logits[extra], 1, spec.penalties);
    }
  }
  for (int i = 0; i < spec.num_logit_bias; ++i) {
    const LogitBias& b = spec.logit_bias[i];
    if (b.token >= 0 && b.token < vocab) logits[b.token] += b.bias;
  }
}

void apply_token_mask(float* logits, int vocab, const uint32_t* allowed) {
  for (int w = 0; w * 32 < vocab; ++w) {
    const uint32_t bits = allowed[w];
    if (bits == 0xFFFFFFFFu) continue;
    const int end = std::min(vocab, w * 32 + 32);
    for (int i = w * 32; i < end; ++i) {
      if (!((bits >> (i - w * 32)) & 1u)) logits[i] = -INFINITY;
    }
  }
}

void token_logprobs(const float* logits, int vocab, int32_t token, int top, TokenLogprobs* out) {
  *out = TokenLogprobs{};
  const int32_t best = argmax(logits, vocab);
  if (best < 0) {  // nothing but NaN
    out->logprob = NAN;
    return;
  }
  const double mx = logits[best];
  double sum = 0;
  for (int i = 0; i < vocab; ++i) {
    // An infinite maximum (+inf, or every logit -inf) is shared by the tokens that have it.
    if (!std::isnan(logits[i]))
      sum += std::isinf(mx) ? (logits[i] == mx ? 1.0 : 0.0) : std::exp(logits[i] - mx);
  }
  const double lse = std::isinf(mx) ? std::log(sum) : mx + std::log(sum);
  auto logprob = [&](int32_t t) {
    if (std::isinf(mx)) return logits[t] == mx ? static_cast<float>(-lse) : -INFINITY;
    return static_cast<float>(static_cast<double>(logits[t]) - lse);
  };
  out->logprob = token >= 0 && token < vocab ? logprob(token) : -INFINITY;
  std::vector<int32_t> idx;
  idx.reserve(static_cast<size_t>(vocab));
  for (int32_t i = 0; i < vocab; ++i) {
    if (!std::isnan(logits[i])) idx.push_back(i);
  }
  const int k = std::min({std::max(0, top), kMaxTopLogprobs, static_cast<int>(idx.size())});
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  out->num_top = k;
  for (int i = 0; i < k; ++i) {
    out->top_ids[i] = idx[static_cast<size_t>(i)];
    out->top_logprobs[i] = logprob(idx[static_cast<size_t>(i)]);
  }
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
