// RecentPeak: the largest value seen in the last window of seconds, forgetting older ones.
// StepCost: the engine's time per token, learned from step times.
#include <gtest/gtest.h>

#include "workers/utilization.h"

namespace hr::workers {
namespace {

constexpr int64_t kSecond = 1000000000;

TEST(RecentPeakTest, KeepsTheLargestValueOfTheWindowAndForgetsOlderOnes) {
  RecentPeak p(3);
  EXPECT_EQ(p.peak(), 0);
  p.record(5, 100 * kSecond);
  p.record(2, 100 * kSecond + kSecond / 2);
  EXPECT_EQ(p.peak(), 5);
  p.record(1, 101 * kSecond);
  p.record(3, 102 * kSecond);
  EXPECT_EQ(p.peak(), 5);  // second 100 is still inside the 3-s window
  p.record(0, 103 * kSecond);
  EXPECT_EQ(p.peak(), 3);      // second 100 left it
  p.record(0, 200 * kSecond);  // a long gap clears everything
  EXPECT_EQ(p.peak(), 0);
}

TEST(StepCostTest, SizesStepsFromTheTimePerTokenOfLargeSteps) {
  StepCost c;
  EXPECT_EQ(c.tokens_within(100), 0);  // nothing known yet
  c.record(50'000'000, 4);             // small steps are all fixed cost: ignored
  EXPECT_EQ(c.tokens_within(100), 0);
  c.record(32'000'000, 32);  // 1 ms per token
  EXPECT_EQ(c.tokens_within(100), 100);
  EXPECT_EQ(c.tokens_within(1), StepCost::kMinTokens);     // never below a useful step
  for (int i = 0; i < 100; ++i) c.record(64'000'000, 32);  // the machine got twice as slow
  EXPECT_NEAR(c.tokens_within(100), 50, 1);
}

}  // namespace
}  // namespace hr::workers
