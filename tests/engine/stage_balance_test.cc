// The stage split (engine/stage_balance.h): the slowest stage as fast as any contiguous split
// allows (checked against every split), the first and last stages' own work counted, and splits
// within the tolerance of the best left where they are.
#include "engine/stage_balance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

namespace hr::engine {
namespace {

TEST(StageBalanceTest, EvenLayersStayEven) {
  EXPECT_EQ(even_stages(12, 5), (std::vector<int>{2, 2, 3, 2, 3}));
  StageCosts costs{std::vector<double>(4, 1.0), 0, 0};
  EXPECT_EQ(balance_stages(costs, 2), (std::vector<int>{2, 2}));
  EXPECT_EQ(balance_stages(costs, 4), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(balance_stages(costs, 1), (std::vector<int>{4}));
}

// Twelve equal layers and an LM head of 3.5 layers: 8 + 4 (stages of 8 and 7.5) rather than
// 6 + 6 (6 and 9.5).
TEST(StageBalanceTest, AHeavyLastStageGivesLayersToTheFirst) {
  StageCosts costs{std::vector<double>(12, 1.0), 0.1, 3.5};
  const std::vector<int> split = balance_stages(costs, 2);
  EXPECT_EQ(split, (std::vector<int>{8, 4}));
  EXPECT_DOUBLE_EQ(stage_cost(costs, split, 0), 8.1);
  EXPECT_DOUBLE_EQ(stage_cost(costs, split, 1), 7.5);
  EXPECT_DOUBLE_EQ(slowest_stage(costs, even_stages(12, 2)), 9.5);
  // Three stages: the head's stage gets the fewest layers.
  const std::vector<int> three = balance_stages(costs, 3);
  EXPECT_EQ(three, (std::vector<int>{5, 5, 2}));
  EXPECT_DOUBLE_EQ(slowest_stage(costs, three), 5.5);
}

// Against every contiguous split of random costs: none has a faster slowest stage.
TEST(StageBalanceTest, NoSplitHasAFasterSlowestStage) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> cost(0.2, 3.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int L = 2 + static_cast<int>(rng() % 9),
              pp = 1 + static_cast<int>(rng() % std::min(L, 4));
    StageCosts costs;
    for (int i = 0; i < L; ++i) costs.layer.push_back(cost(rng));
    costs.first = cost(rng) * (rng() % 2);
    costs.last = cost(rng) * 3;
    double best = 1e30;
    std::vector<int> split;
    std::function<void(int, int)> every = [&](int stage, int left) {
      if (stage == pp - 1) {
        split.push_back(left);
        best = std::min(best, slowest_stage(costs, split));
        split.pop_back();
        return;
      }
      for (int n = 1; n <= left - (pp - 1 - stage); ++n) {
        split.push_back(n);
        every(stage + 1, left - n);
        split.pop_back();
      }
    };
    every(0, L);
    const std::vector<int> got = balance_stages(costs, pp);
    ASSERT_EQ(static_cast<int>(got.size()), pp);
    int sum = 0;
    for (int n : got) {
      EXPECT_GE(n, 1);
      sum += n;
    }
    EXPECT_EQ(sum, L);
    EXPECT_NEAR(slowest_stage(costs, got), best, 1e-9) << "trial " << trial;
  }
}

// Within the tolerance of the best, the layers stay where they are (measurement noise moves
// nothing); a clear gain moves them.
TEST(StageBalanceTest, SplitsWithinTheToleranceStayPut) {
  StageCosts costs{{1.0, 1.0, 1.0, 1.0}, 0, 0.9};
  // Best: 2 + 2 (stages of 2 and 2.9); 3 + 1 (3 and 1.9) is within 5% of it.
  EXPECT_EQ(balance_stages(costs, 2, {2, 2}, 0.05), (std::vector<int>{2, 2}));
  EXPECT_EQ(balance_stages(costs, 2, {3, 1}, 0.05), (std::vector<int>{3, 1}));
  EXPECT_EQ(balance_stages(costs, 2, {3, 1}, 0), (std::vector<int>{2, 2}));
  // A clear gain moves them: 3 + 1 (3 and 2.5) against 2 + 2 (2 and 3.5).
  costs.last = 1.5;
  EXPECT_EQ(balance_stages(costs, 2, {2, 2}, 0.05), (std::vector<int>{3, 1}));
}

}  // namespace
}  // namespace hr::engine
