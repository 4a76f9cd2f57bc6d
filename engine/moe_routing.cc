// Host routing: softmax or sigmoid scores, (group-limited) top k, weights.
#include "engine/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace hr::engine {

namespace {

// The k largest of `score` among the allowed ids, best first, ties to the lower id.
void top_k(const float* score, std::vector<bool> allowed, int k, int32_t* out) {
  const int n = static_cast<int>(allowed.size());
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < n; ++e) {
      if (!allowed[static_cast<size_t>(e)]) continue;
      if (best < 0 || score[e] > score[best]) best = e;
    }
    out[j] = best;
    if (best >= 0) allowed[static_cast<size_t>(best)] = false;
  }
}

}  // namespace

void route_tokens(const float* logits, int num_tokens, const MoeConfig& moe, const float* bias,
                  int32_t* experts, float* weights) {
  const int E = moe.num_experts, K = moe.top_k;
  std::vector<float> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<bool> allowed(static_cast<size_t>(E));
  for (int t = 0; t < num_tokens; ++t) {
    const float* row = logits + static_cast<size_t>(t) * E;
    int32_t* ids = experts + static_cast<size_t>(t) * K;
    float* w = weights + static_cast<size_t>(t) * K;
    std::fill(allowed.begin(), allowed.end(), true);
    if (moe.scoring == RouterScoring::kSoftmax) {
      float mx = row[0];
      for (int e = 1; e < E; ++e) mx = std::max(mx, row[e]);
      float sum = 0;
      for (int e = 0; e < E; ++e) sum += score[e] = std::exp(row[e] - mx);
      for (int e = 0; e < E; ++e) score[e] /= sum;
      top_k(score.data(), allowed, K, ids);
    } else {
      for (int e = 0; e < E; ++e) {
        score[e] = 1.0f / (1.0f + std::exp(-row[e]));
        choice[e] = score[e] + (bias ? bias[e] : 0.0f);
      }
      const int G = std::max(1, moe.num_groups), per = E / G;
      if (G > 1) {
        // Each group's score: the sum of its two best choice scores; keep the topk_groups best.
        std::vector<float> group(static_cast<size_t>(G));
        for (int g = 0; g < G; ++g) {
          float a = -INFINITY, b = -INFINITY;
          for (int e = g * per; e < (g + 1) * per; ++e) {
            if (choice[e] > a) {
              b = a;
              a = choice[e];
            } else if (choice[e] > b) {
              b = choice[e];
            }
          }
          group[static_cast<size_t>(g)] = per > 1 ? a + b : a;
        }
        std::vector<bool> all_groups(static_cast<size_t>(G), true);
        std::vector<int32_t> kept(static_cast<size_t>(moe.topk_groups));
        top_k(group.data(), all_groups, moe.topk_groups, kept.data());
        std::fill(allowed.begin(), allowed.end(), false);
        for (int32_t g : kept) {
          for (int e = g * per; e < (g + 1) * per; ++e) allowed[static_cast<size_t>(e)] = true;
        }
      }
      top_k(choice.data(), allowed, K, ids);
    }
    float total = 0;
    for (int j = 0; j < K; ++j) total += w[j] = score[static_cast<size_t>(ids[j])];
    for (int j = 0; j < K; ++j) {
      if (moe.renormalize) w[j] /= total;
      w[j] *= moe.routed_scaling_factor;
    }
  }
}

}  // namespace hr::engine
