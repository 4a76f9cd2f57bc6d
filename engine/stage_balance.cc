// The split of contiguous layers into stages whose slowest stage is fastest: a small dynamic
// program over (stage, layers so far).
#include "engine/stage_balance.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "engine/memory_plan.h"

namespace hr::engine {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Prefix sums of the layers' costs: layers [a, b) cost sum[b] - sum[a].
std::vector<double> prefix_sums(const StageCosts& costs) {
  std::vector<double> sum(costs.layer.size() + 1, 0.0);
  for (size_t i = 0; i < costs.layer.size(); ++i) sum[i + 1] = sum[i] + costs.layer[i];
  return sum;
}

// Stage s holding layers [a, b).
double span_cost(const StageCosts& costs, const std::vector<double>& sum, int pp, int s, int a,
                 int b) {
  double c = sum[static_cast<size_t>(b)] - sum[static_cast<size_t>(a)];
  if (s == 0) c += costs.first;
  if (s == pp - 1) c += costs.last;
  return c;
}

}  // namespace

std::vector<int> even_stages(int num_layers, int pp) {
  std::vector<int> out;
  for (int s = 0; s < pp; ++s) {
    out.push_back(stage_first_layer(num_layers, pp, {}, s + 1) -
                  stage_first_layer(num_layers, pp, {}, s));
  }
  return out;
}

double stage_cost(const StageCosts& costs, const std::vector<int>& stage_layers, int stage) {
  const int pp = static_cast<int>(stage_layers.size());
  const int first =
      stage_first_layer(static_cast<int>(costs.layer.size()), pp, stage_layers, stage);
  double c = 0;
  for (int i = first; i < first + stage_layers[static_cast<size_t>(stage)]; ++i) {
    c += costs.layer[static_cast<size_t>(i)];
  }
  if (stage == 0) c += costs.first;
  if (stage == pp - 1) c += costs.last;
  return c;
}

double slowest_stage(const StageCosts& costs, const std::vector<int>& stage_layers) {
  double worst = 0;
  for (int s = 0; s < static_cast<int>(stage_layers.size()); ++s) {
    worst = std::max(worst, stage_cost(costs, stage_layers, s));
  }
  return worst;
}

std::vector<int> balance_stages(const StageCosts& costs, int pp, const std::vector<int>& current,
                                double tolerance) {
  const int L = static_cast<int>(costs.layer.size());
  const std::vector<double> sum = prefix_sums(costs);
  const size_t width = static_cast<size_t>(L) + 1;
  // best[s * width + i]: the least slowest-stage cost of stages 0..s holding layers [0, i);
  // from[s * width + i]: where stage s begins in that split.
  std::vector<double> best(static_cast<size_t>(pp) * width, kInf);
  std::vector<int> from(static_cast<size_t>(pp) * width, 0);
  for (int i = 1; i <= L; ++i) best[static_cast<size_t>(i)] = span_cost(costs, sum, pp, 0, 0, i);
  for (int s = 1; s < pp; ++s) {
    for (int i = s + 1; i <= L; ++i) {
      for (int j = s; j < i; ++j) {
        const double b = std::max(best[static_cast<size_t>(s - 1) * width + j],
                                  span_cost(costs, sum, pp, s, j, i));
        if (b < best[static_cast<size_t>(s) * width + i]) {
          best[static_cast<size_t>(s) * width + i] = b;
          from[static_cast<size_t>(s) * width + i] = j;
        }
      }
    }
  }
  // The reference (the current split, else the even one) stays if it is close enough.
  const std::vector<int> ref =
      current.size() == static_cast<size_t>(pp) ? current : even_stages(L, pp);
  const double target = best[static_cast<size_t>(pp - 1) * width + L];
  if (slowest_stage(costs, ref) <= target * (1 + tolerance) + 1e-12 * std::abs(target)) {
    return ref;
  }
  std::vector<int> out(static_cast<size_t>(pp));
  for (int s = pp - 1, i = L; s >= 0; --s) {
    const int j = s == 0 ? 0 : from[static_cast<size_t>(s) * width + i];
    out[static_cast<size_t>(s)] = i - j;
    i = j;
  }
  return out;
}

}  // namespace hr::engine
