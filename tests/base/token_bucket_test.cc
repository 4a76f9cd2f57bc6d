// TokenBucket (base/token_bucket.h): a full burst at once, then the rate, never above the burst.
#include "base/token_bucket.h"

#include <gtest/gtest.h>

namespace hr {
namespace {

TEST(TokenBucketTest, ABurstThenTheRateNeverMoreThanTheBurst) {
  int64_t now = 0;
  TokenBucket b(100, 10, [&] { return now; });
  int taken = 0;
  for (int i = 0; i < 50; ++i) taken += b.take();
  EXPECT_EQ(taken, 10);
  now += 50'000'000;  // 50 ms: 5 more
  taken = 0;
  for (int i = 0; i < 50; ++i) taken += b.take();
  EXPECT_EQ(taken, 5);
  now += 10'000'000'000;  // 10 s idle: back to the burst, not 1,000
  taken = 0;
  for (int i = 0; i < 2000; ++i) taken += b.take();
  EXPECT_EQ(taken, 10);
}

}  // namespace
}  // namespace hr
