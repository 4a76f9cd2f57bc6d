// The headroom policy stepped through scenarios, one assertion per step: a sync burst, a long
// async backlog, KV nearly full, draining and the utilization brake; and the request sizes it
// learns KV needs from.
#include "workers/headroom_policy.h"

#include <gtest/gtest.h>

namespace hr::workers {
namespace {

// A worker of 32 slots, 1,000 KV blocks, reserve 2, max_pull 64, and a step loop's view of it.
struct Loop {
  HeadroomPolicyConfig config{32, 2, 64};
  PolicyState state;
  Loop() {
    state.headroom.free_seq_slots = 32;
    state.headroom.free_kv_blocks = 1000;
    state.headroom.total_kv_blocks = 1000;
    state.headroom.token_budget_left = 512;
    state.blocks_per_request = 4;
  }
  // Moves `n` async requests into the engine (the pull arrived), each taking `blocks`.
  void admit_async(int n, int blocks) {
    state.headroom.running_async += n;
    state.headroom.free_seq_slots -= n;
    state.headroom.free_kv_blocks -= n * blocks;
    state.engine_has_work = true;
  }
  void finish_async(int n, int blocks) {
    state.headroom.running_async -= n;
    state.headroom.free_seq_slots += n;
    state.headroom.free_kv_blocks += n * blocks;
    state.engine_has_work = state.headroom.running_async + state.headroom.running_sync > 0;
  }
  Credits grant() { return grant_credits(state, config); }
};

TEST(HeadroomPolicyTest, AnIdleWorkerPullsAllButTheReserve) {
  Loop l;
  Credits c = l.grant();
  EXPECT_EQ(c.granted, 30);
  EXPECT_EQ(c.reserve, 2);
  EXPECT_EQ(c.limit, CreditLimit::kSlots);
}

TEST(HeadroomPolicyTest, ASyncBurstStopsPullsAndItsPeakIsKeptFreeAfterwards) {
  Loop l;
  // Step 1: idle, the backlog is pulled into 30 slots.
  ASSERT_EQ(l.grant().granted, 30);
  l.admit_async(30, 4);
  // Step 2: full but for the reserve; nothing more.
  EXPECT_EQ(l.grant().granted, 0);
  // Step 3: a burst of 6 sync requests arrives and waits for the engine: no pull at all.
  l.state.headroom.waiting_sync = 6;
  l.state.sync_peak = 6;
  Credits c = l.grant();
  EXPECT_EQ(c.granted, 0);
  EXPECT_EQ(c.limit, CreditLimit::kWaiting);
  // Step 4: the engine preempted 4 async requests to run all 6; still none.
  l.state.headroom.waiting_sync = 0;
  l.state.headroom.running_sync = 6;
  l.finish_async(4, 4);
  l.state.headroom.free_seq_slots -= 6;
  EXPECT_EQ(l.grant().granted, 0);
  // Step 5: the burst is over and 10 async requests finished meanwhile: 16 slots are free, but
  // the peak (6 sync at once) is kept free, not the configured 2.
  l.state.headroom.running_sync = 0;
  l.state.headroom.free_seq_slots += 6;
  l.finish_async(10, 4);
  c = l.grant();
  EXPECT_EQ(l.state.headroom.free_seq_slots, 16);
  EXPECT_EQ(c.reserve, 6);
  EXPECT_EQ(c.granted, 10);
  // Step 6: once the burst leaves the window, the reserve is the configured one again.
  l.state.sync_peak = 0;
  EXPECT_EQ(l.grant().granted, 14);
}

TEST(HeadroomPolicyTest, ABurstLargerThanHalfTheSlotsReservesHalf) {
  Loop l;
  l.state.sync_peak = 40;  // more than the worker has: a past burst must not shut async work out
  Credits c = l.grant();
  EXPECT_EQ(c.reserve, 16);
  EXPECT_EQ(c.granted, 16);
}

TEST(HeadroomPolicyTest, ALongBacklogIsPulledAtMostMaxPullAtATimeAndNotTwice) {
  Loop l;
  l.config.max_num_seqs = 256;
  l.config.max_pull = 64;
  l.state.headroom.free_seq_slots = 256;
  l.state.headroom.free_kv_blocks = 100000;
  // Step 1: 64 granted, not 254.
  Credits c = l.grant();
  EXPECT_EQ(c.granted, 64);
  EXPECT_EQ(c.limit, CreditLimit::kMaxPull);
  // Step 2: those 64 are still on their way: nothing more is granted.
  l.state.in_transit = 64;
  c = l.grant();
  EXPECT_EQ(c.granted, 0);
  EXPECT_EQ(c.limit, CreditLimit::kInTransit);
  // Step 3: 40 arrived and run; 24 are still on their way: 64 - 24 more.
  l.admit_async(40, 4);
  l.state.in_transit = 24;
  EXPECT_EQ(l.grant().granted, 40);
  // Step 4: the pulled work queues in the engine (it waits for a step): no more until it runs.
  l.state.headroom.waiting_async = 24;
  l.state.in_transit = 0;
  EXPECT_EQ(l.grant().limit, CreditLimit::kWaiting);
  // Step 5: the last step used its whole token budget: new work would only wait.
  l.state.headroom.waiting_async = 0;
  l.state.headroom.token_budget_left = 0;
  c = l.grant();
  EXPECT_EQ(c.granted, 0);
  EXPECT_EQ(c.limit, CreditLimit::kTokenBudget);
}

TEST(HeadroomPolicyTest, KvNearlyFullLimitsPullsByTheSizeOfARequest) {
  Loop l;
  l.state.headroom.free_kv_blocks = 100;
  // Step 1: 100 blocks, 2 requests' worth kept for sync, 4 blocks each: 23.
  Credits c = l.grant();
  EXPECT_EQ(c.granted, 23);
  EXPECT_EQ(c.limit, CreditLimit::kKvBlocks);
  // Step 2: requests turn out to need 20 blocks each (long prompts, long answers): 3.
  l.state.blocks_per_request = 20;
  EXPECT_EQ(l.grant().granted, 3);
  // Step 3: those 3 run and fill the cache to 40 free blocks: none (the reserve's 40 stay).
  l.admit_async(3, 20);
  c = l.grant();
  EXPECT_EQ(l.state.headroom.free_kv_blocks, 40);
  EXPECT_EQ(c.granted, 0);
  EXPECT_EQ(c.limit, CreditLimit::kKvBlocks);
  // Step 4: one finishes: 60 free, room for one more.
  l.finish_async(1, 20);
  EXPECT_EQ(l.grant().granted, 1);
}

TEST(HeadroomPolicyTest, DrainingPullsNothingWhateverTheRoom) {
  Loop l;
  ASSERT_GT(l.grant().granted, 0);
  l.state.stopping = true;
  Credits c = l.grant();
  EXPECT_EQ(c.granted, 0);
  EXPECT_EQ(c.limit, CreditLimit::kStopping);
  l.finish_async(0, 0);
  EXPECT_EQ(l.grant().granted, 0);
}

TEST(HeadroomPolicyTest, TheBrakeHoldsPullsBackOnlyWhileEngagedAndOnlyWhenThereWasRoom) {
  Loop l;
  l.state.brake_engaged = true;
  // Step 1: room for 30, held back by the brake.
  Credits c = l.grant();
  EXPECT_EQ(c.granted, 0);
  EXPECT_EQ(c.limit, CreditLimit::kBrake);
  // Step 2: no room anyway: the slots, not the brake, are what held it back (not counted as
  // braked).
  l.admit_async(30, 4);
  EXPECT_EQ(l.grant().limit, CreditLimit::kSlots);
  // Step 3: the brake releases; 10 finished meanwhile.
  l.state.brake_engaged = false;
  l.finish_async(10, 4);
  EXPECT_EQ(l.grant().granted, 10);
}

TEST(HeadroomPolicyTest, CatchUpIsPulledOnAFullWorkerUpToItsSlotsLessSync) {
  Loop l;
  l.admit_async(30, 4);  // full: no credits, waiting or not
  EXPECT_EQ(l.grant().granted, 0);
  // Catch-up work takes the place of the async work running: the slots less the reserve.
  EXPECT_EQ(catch_up_credits(l.state, l.config), 30);
  // Less what it holds already or has on the way.
  l.state.catch_up_held = 20;
  l.state.catch_up_in_transit = 4;
  EXPECT_EQ(catch_up_credits(l.state, l.config), 6);
  // Less the sync sequences, and a recent sync peak's reserve: sync still comes first.
  l.state.catch_up_held = l.state.catch_up_in_transit = 0;
  l.state.headroom.running_sync = 5;
  l.state.headroom.waiting_sync = 1;
  EXPECT_EQ(catch_up_credits(l.state, l.config), 24);
  l.state.sync_peak = 16;
  EXPECT_EQ(catch_up_credits(l.state, l.config), 16);
  // At most max_pull at once; nothing while stopping; never negative.
  l.config.max_num_seqs = 256;
  EXPECT_EQ(catch_up_credits(l.state, l.config), 64);
  l.state.catch_up_held = 300;
  EXPECT_EQ(catch_up_credits(l.state, l.config), 0);
  l.state.catch_up_held = 0;
  l.state.stopping = true;
  EXPECT_EQ(catch_up_credits(l.state, l.config), 0);
}

TEST(RequestSizesTest, LearnsTheKvBlocksOfPulledRequests) {
  RequestSizes sizes(16);
  // Before any: a short prompt with the default 256-token answer.
  EXPECT_EQ(sizes.blocks_per_request(), 16);
  // A request of 30 prompt tokens and 34 answer tokens needs 4 blocks of 16.
  sizes.record(30, 34);
  EXPECT_EQ(sizes.blocks_per_request(), 4);
  for (int i = 0; i < 15; ++i) sizes.record(30, 34);
  EXPECT_EQ(sizes.blocks_per_request(), 4);
  // Long requests arrive: the estimate follows them within a few dozen.
  for (int i = 0; i < 64; ++i) sizes.record(1000, 1048);
  EXPECT_GE(sizes.blocks_per_request(), 120);  // 2,048 tokens: 128 blocks
  EXPECT_LE(sizes.blocks_per_request(), 128);
  // Blocks are whole: 17 tokens take 2.
  RequestSizes small(16);
  small.record(10, 7);
  EXPECT_EQ(small.blocks_per_request(), 2);
}

}  // namespace
}  // namespace hr::workers
