// The fair-share forecast (queue/estimate.h): checked against hand-computed shares, which are
// what the relay's fair share gives (docs/fair-share.md).
#include "queue/estimate.h"

#include <gtest/gtest.h>

namespace hr::queue {
namespace {

OpenBatch batch(std::string id, std::string account, int64_t remaining, int64_t queued,
                double weight = 1, int priority = 0, std::optional<int64_t> deadline = {}) {
  OpenBatch b;
  b.id = std::move(id);
  b.account_id = std::move(account);
  b.weight = weight;
  b.priority = priority;
  b.deadline_ms = deadline;
  b.remaining = remaining;
  b.queued = queued;
  return b;
}

TEST(QueueEstimateTest, AloneABatchTakesItsSizeOverTheRate) {
  QueueEstimate e({batch("x", "a", 1000, 900)});
  EXPECT_DOUBLE_EQ(*e.seconds_to_finish("x", 100), 10);
  EXPECT_FALSE(e.seconds_to_finish("x", 0));
  EXPECT_FALSE(e.seconds_to_finish("nope", 100));
  EXPECT_EQ(e.positions("x")->at(0), 0);
  EXPECT_EQ(e.positions("x")->at(899), 899);
}

// A small tenant behind a big one shares the rate equally until it is done: 50 requests behind
// 20,000 take the time of 100, not of 20,050. The big one ends after all of both.
TEST(QueueEstimateTest, AccountsShareTheRateByWeight) {
  QueueEstimate e({batch("big", "a", 20000, 19000), batch("small", "b", 50, 50)});
  EXPECT_DOUBLE_EQ(*e.seconds_to_finish("small", 10), 10);
  EXPECT_DOUBLE_EQ(*e.seconds_to_finish("big", 10), 2005);
  // Its requests are sent one for one with the big tenant's.
  auto p = e.positions("small");
  EXPECT_EQ(p->at(0), 0);
  EXPECT_EQ(p->at(10), 20);
  EXPECT_EQ(p->at(49), 98);
  // Weights 3:1: the small tenant (weight 1) gets a quarter.
  QueueEstimate w({batch("big", "a", 20000, 19000, 3), batch("small", "b", 100, 100, 1)});
  EXPECT_DOUBLE_EQ(*w.seconds_to_finish("small", 10), 40);
  EXPECT_EQ(w.positions("small")->at(10), 40);
  // The big tenant of weight 3 against a small one of weight 1: 3 of its requests for each of
  // the small one's until that is done.
  EXPECT_EQ(w.positions("big")->at(30), 40);
  EXPECT_EQ(w.positions("big")->at(1000), 1100);
}

// Within an account: higher priority first, then a deadline before none; batches alike share.
TEST(QueueEstimateTest, WithinAnAccountPriorityThenDeadlineThenEqualShares) {
  QueueEstimate e({batch("urgent", "a", 100, 100, 1, 5), batch("dated", "a", 200, 200, 1, 0, 1000),
                   batch("plain1", "a", 300, 300), batch("plain2", "a", 50, 50),
                   batch("other", "b", 10, 10)});
  // urgent: only itself in its account, and as much of the other account's.
  EXPECT_DOUBLE_EQ(*e.seconds_to_finish("urgent", 1), 110);
  // dated: behind urgent.
  EXPECT_DOUBLE_EQ(*e.seconds_to_finish("dated", 1), 310);
  // plain2 shares with plain1 (alike): 50 of each, after urgent and dated.
  EXPECT_DOUBLE_EQ(*e.seconds_to_finish("plain2", 1), 100 + 200 + 50 + 50 + 10);
  EXPECT_DOUBLE_EQ(*e.seconds_to_finish("plain1", 1), 100 + 200 + 300 + 50 + 10);
  EXPECT_EQ(e.positions("plain2")->at(0), 100 + 200 + 10);
  EXPECT_EQ(e.positions("plain2")->at(20), 100 + 200 + 20 + 20 + 10);
}

}  // namespace
}  // namespace hr::queue
