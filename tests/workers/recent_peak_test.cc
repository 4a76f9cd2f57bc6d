// RecentPeak: the largest value seen in the last window of seconds, forgetting older ones.
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
  EXPECT_EQ(p.peak(), 3);  // second 100 left it
  p.record(0, 200 * kSecond);  // a long gap clears everything
  EXPECT_EQ(p.peak(), 0);
}

}  // namespace
}  // namespace hr::workers
