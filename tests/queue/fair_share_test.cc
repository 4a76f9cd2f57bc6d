// The relay's fair share of a ready-queue's room, and the ready-queue's size.
#include "queue/fair_share.h"

#include <gtest/gtest.h>

#include <map>

#include "queue/relay_window.h"

namespace hr::queue {
namespace {

std::map<std::string, int64_t> totals(const std::vector<ShareGrant>& grants) {
  std::map<std::string, int64_t> out;
  for (const ShareGrant& g : grants) out[g.batch_id] += g.count;
  return out;
}

ShareAccount account(const std::string& id, double weight, int64_t in_flight,
                     std::vector<ShareBatch> batches) {
  ShareAccount a;
  a.id = id;
  a.weight = weight;
  a.in_flight = in_flight;
  for (const ShareBatch& b : batches) a.in_flight += b.in_flight;
  a.batches = std::move(batches);
  return a;
}

TEST(FairShareTest, ANewcomerGetsTheRoomUntilItHasAsMuchInFlight) {
  // A has 300 in flight; B nothing. Room for 200: all of it to B. Room for 500: B catches up to
  // A's 300, then they share the rest.
  std::vector<ShareAccount> in = {account("A", 1, 0, {{"a1", 0, {}, 300, 100000}}),
                                  account("B", 1, 0, {{"b1", 0, {}, 0, 50}})};
  auto t = totals(share_room(in, 40));
  EXPECT_EQ(t["b1"], 40);
  EXPECT_EQ(t.count("a1"), 0u);
  in[1].batches[0].remaining = 100000;
  t = totals(share_room(in, 500));
  EXPECT_NEAR(t["b1"], 400, 8);  // 300 to catch up, then half of the last 200
  EXPECT_NEAR(t["a1"], 100, 8);
  EXPECT_EQ(t["a1"] + t["b1"], 500);
}

int64_t caught_up(const std::vector<ShareGrant>& grants, const std::string& batch) {
  int64_t n = 0;
  for (const ShareGrant& g : grants) {
    if (g.batch_id == batch && g.catch_up) n += g.count;
  }
  return n;
}

TEST(FairShareTest, AnAccountFarBehindCatchesUp) {
  // A has 300 in flight; B's 50 are all it has, and it is still far behind with them: all of
  // them catch up. A's grants never do.
  std::vector<ShareAccount> in = {account("A", 1, 0, {{"a1", 0, {}, 300, 100000}}),
                                  account("B", 1, 0, {{"b1", 0, {}, 0, 50}})};
  auto grants = share_room(in, 256, 0.5);
  EXPECT_EQ(totals(grants)["b1"], 50);
  EXPECT_EQ(caught_up(grants, "b1"), 50);
  EXPECT_EQ(caught_up(grants, "a1"), 0);
  EXPECT_GT(totals(grants)["a1"], 0);
  // A big newcomer: only what brings it to half of A's 300 catches up; the rest is its share as
  // usual.
  in[1].batches[0].remaining = 100000;
  grants = share_room(in, 640, 0.5);
  EXPECT_EQ(caught_up(grants, "b1"), 150);
  EXPECT_EQ(totals(grants)["b1"], 470);  // 300 to catch up with A, then half of the rest
  // Weights count: B of weight 3 is far behind until it holds 450.
  in[1].weight = 3;
  EXPECT_EQ(caught_up(share_room(in, 2000, 0.5), "b1"), 450);
  // Without catch_up_below, none.
  EXPECT_EQ(caught_up(share_room(in, 640), "b1"), 0);
}

TEST(FairShareTest, AccountsNearTheirSharesNeverCatchUp) {
  // Two saturating accounts of weights 3 and 1, each near its share of what is in flight, get
  // refills in every pass: none catches up (so neither preempts the other).
  std::vector<ShareAccount> in = {account("C", 3, 0, {{"c1", 0, {}, 290, 100000}}),
                                  account("D", 1, 0, {{"d1", 0, {}, 90, 100000}})};
  for (int64_t room : {1, 10, 40, 400}) {
    auto grants = share_room(in, room, 0.5);
    EXPECT_EQ(caught_up(grants, "c1") + caught_up(grants, "d1"), 0) << room;
  }
  // Nor when both start together from nothing.
  {
    std::vector<ShareAccount> fresh = {account("C", 3, 0, {{"c1", 0, {}, 0, 100000}}),
                                       account("D", 1, 0, {{"d1", 0, {}, 0, 100000}})};
    auto grants = share_room(fresh, 400, 0.5);
    EXPECT_EQ(caught_up(grants, "c1") + caught_up(grants, "d1"), 0);
  }
  // One that has nothing left to send still counts: D, alone with something to send but with
  // 10 in flight against C's 290 (96.7 per weight), catches up to half of C's (39 more), then
  // gets the rest of the room as usual.
  in[0].batches[0].remaining = 0;
  in[1].in_flight = in[1].batches[0].in_flight = 10;
  auto grants = share_room(in, 400, 0.5);
  EXPECT_EQ(totals(grants)["d1"], 400);
  EXPECT_EQ(caught_up(grants, "d1"), 39);
}

TEST(FairShareTest, WeightsSplitTheRoomInProportion) {
  std::vector<ShareAccount> in = {account("A", 3, 0, {{"a1", 0, {}, 0, 100000}}),
                                  account("B", 1, 0, {{"b1", 0, {}, 0, 100000}})};
  auto t = totals(share_room(in, 4000));
  EXPECT_NEAR(t["a1"], 3000, 70);
  EXPECT_NEAR(t["b1"], 1000, 70);
}

TEST(FairShareTest, WorkConservingWhenAnAccountRunsOut) {
  std::vector<ShareAccount> in = {account("A", 1, 0, {{"a1", 0, {}, 0, 100000}}),
                                  account("B", 10, 0, {{"b1", 0, {}, 0, 30}})};
  auto t = totals(share_room(in, 1000));
  EXPECT_EQ(t["b1"], 30);
  EXPECT_EQ(t["a1"], 970);
  // Nothing left anywhere: less than the room.
  in[0].batches[0].remaining = 5;
  t = totals(share_room(in, 1000));
  EXPECT_EQ(t["a1"] + t["b1"], 35);
}

TEST(FairShareTest, GrantsInterleaveTheAccounts) {
  std::vector<ShareAccount> in = {account("A", 1, 0, {{"a1", 0, {}, 0, 100000}}),
                                  account("B", 1, 0, {{"b1", 0, {}, 0, 100000}})};
  auto grants = share_room(in, 640);
  ASSERT_GE(grants.size(), 32u);  // pieces of ~room/64, alternating
  for (size_t k = 1; k < grants.size(); ++k) {
    EXPECT_NE(grants[k].batch_id, grants[k - 1].batch_id);
  }
  // The first half of the stream holds as much of each.
  int64_t a = 0, b = 0, n = 0;
  for (const ShareGrant& g : grants) {
    if (n >= 320) break;
    (g.batch_id == "a1" ? a : b) += g.count;
    n += g.count;
  }
  EXPECT_NEAR(a, b, 20);
}

TEST(FairShareTest, WithinAnAccountPriorityThenDeadlineThenLeastInFlight) {
  // Priority first: the high batch takes everything it has.
  std::vector<ShareAccount> in = {account("A", 1, 0,
                                          {{"low", 0, {}, 0, 1000},
                                           {"high", 5, {}, 0, 60},
                                           {"late", 0, 9000, 0, 1000},
                                           {"soon", 0, 5000, 0, 20},
                                           {"low2", 0, {}, 400, 1000}})};
  auto grants = share_room(in, 100);
  auto t = totals(grants);
  EXPECT_EQ(grants[0].batch_id, "high");
  EXPECT_EQ(t["high"], 60);
  // Then the deadlines, earliest first.
  EXPECT_EQ(t["soon"], 20);
  EXPECT_EQ(t["late"], 20);
  EXPECT_EQ(t.count("low"), 0u);
  // With room past the deadlines' batches, those without share by least in flight: "low" catches
  // up with "low2" (400 in flight) before "low2" gets any.
  t = totals(share_room(in, 1480));
  EXPECT_EQ(t["late"], 1000);
  EXPECT_EQ(t["low"], 400);
  EXPECT_EQ(t.count("low2"), 0u);
}

TEST(FairShareTest, PriorityDoesNotBuyShareFromOtherAccounts) {
  std::vector<ShareAccount> in = {account("A", 1, 0, {{"a1", 100, {}, 0, 100000}}),
                                  account("B", 1, 0, {{"b1", -100, {}, 0, 100000}})};
  auto t = totals(share_room(in, 1000));
  EXPECT_NEAR(t["a1"], 500, 16);
  EXPECT_NEAR(t["b1"], 500, 16);
}

TEST(FairShareTest, NoRoomNoGrants) {
  std::vector<ShareAccount> in = {account("A", 1, 0, {{"a1", 0, {}, 0, 10}})};
  EXPECT_TRUE(share_room(in, 0).empty());
  EXPECT_TRUE(share_room({}, 100).empty());
}

TEST(FairShareTest, WaitingEntriesAreTakenBackWhenANewcomerIsOwedThem) {
  // A's 100 entries wait, none leased; B arrives with nothing. B is owed half the places: with
  // room at the tail, its entries would still wait behind A's 100; everything waiting is taken
  // back, to be pushed again interleaved.
  std::vector<WaitingEntry> waiting;
  for (int i = 0; i < 100; ++i) waiting.push_back({"e" + std::to_string(i), "a1", "A", 200 + i});
  waiting.push_back({"x", "done", "A", 7});  // of a batch with nothing left to send: stays
  std::vector<ShareAccount> in = {account("A", 1, 0, {{"a1", 0, {}, 100, 5000}}),
                                  account("B", 1, 0, {{"b1", 0, {}, 0, 50}})};
  auto back = entries_to_withdraw(in, waiting, 16);
  EXPECT_EQ(back.size(), 100u);
  for (size_t i : back) EXPECT_EQ(waiting[i].batch_id, "a1");
  // A small newcomer too: owed 4, half its share is the threshold.
  in[1].batches[0].remaining = 4;
  EXPECT_EQ(entries_to_withdraw(in, waiting, 16).size(), 100u);
  // A alone: nothing moves; nor when the only other account has nothing left to send (its
  // entries, waiting, cannot be taken back, and A is owed only the room).
  EXPECT_TRUE(entries_to_withdraw({in[0]}, waiting, 16).empty());
  {
    std::vector<ShareAccount> sent = {in[0], account("C", 1, 30, {})};
    std::vector<WaitingEntry> w = waiting;
    for (int i = 0; i < 30; ++i) w.push_back({"c" + std::to_string(i), "c-done", "C", i});
    EXPECT_TRUE(entries_to_withdraw(sent, w, 16).empty());
  }
  // B already holding its share (its entries waiting, some of a batch with nothing left): nothing.
  in[1].batches[0].remaining = 5000;
  in[0].in_flight = in[0].batches[0].in_flight = 50;
  in[1].in_flight = 50;
  in[1].batches[0].in_flight = 40;
  waiting.resize(50);
  for (int i = 0; i < 40; ++i) waiting.push_back({"f" + std::to_string(i), "b1", "B", i});
  for (int i = 0; i < 10; ++i) waiting.push_back({"g" + std::to_string(i), "b0", "B", i});
  EXPECT_TRUE(entries_to_withdraw(in, waiting, 16).empty());
  // A deficit below the threshold is left alone.
  in[1].in_flight = 45;
  waiting.resize(95);
  EXPECT_TRUE(entries_to_withdraw(in, waiting, 16).empty());
  // B holding 40 of the 90 places it would share 45/45 with A: owed 5, under a threshold of 16
  // (nothing moves), over one of 4 (everything that can be taken back is).
  in[1].in_flight = 40;
  waiting.resize(90);
  EXPECT_TRUE(entries_to_withdraw(in, waiting, 16).empty());
  EXPECT_EQ(entries_to_withdraw(in, waiting, 4).size(), 90u);
}

TEST(RelayWindowTest, LearnsTheRateTheWorkersTakeAt) {
  RelayWindow w({/*min_entries=*/100, /*max_entries=*/5000, /*window_ms=*/250});
  int64_t t = 0;
  w.observe(t, 0, 0);
  EXPECT_EQ(w.size(), 100);
  // Workers take 2,000 a second: 20 every 10 ms, the relay keeping the queue at 100.
  for (int k = 0; k < 100; ++k) {
    t += 10'000'000;
    w.observe(t, 80, 20);
  }
  EXPECT_NEAR(w.rate_per_s(), 2000, 50);
  EXPECT_NEAR(w.size(), 500, 15);
  // Faster than the max: capped.
  for (int k = 0; k < 20; ++k) {
    t += 10'000'000;
    w.observe(t, 0, 2000);
  }
  EXPECT_EQ(w.size(), 5000);
  // Idle: back to the least, smoothly.
  for (int k = 0; k < 400; ++k) {
    t += 10'000'000;
    w.observe(t, 0, 0);
  }
  EXPECT_EQ(w.size(), 100);
}

// The model's throughput for estimates: learnt only while entries wait (the workers took as fast
// as they could), so a queue that runs dry (a trickle of work) does not lower it.
TEST(RelayWindowTest, LearnsTheSaturatedRateOnlyWhileEntriesWait) {
  RelayWindow w({/*min_entries=*/100, /*max_entries=*/5000, /*window_ms=*/250});
  int64_t t = 0;
  w.observe(t, 0, 0);
  EXPECT_EQ(w.saturated_rate_per_s(), 0);
  // 3 s at 2,000 a second with 80 waiting at every look.
  for (int k = 0; k < 300; ++k) {
    t += 10'000'000;
    w.observe(t, 80, 20);
  }
  EXPECT_NEAR(w.saturated_rate_per_s(), 2000, 1);
  // 10 s of a trickle: 1 entry every 10 ms, taken before the next look (nothing waits).
  for (int k = 0; k < 1000; ++k) {
    t += 10'000'000;
    w.observe(t, 0, 1);
  }
  EXPECT_NEAR(w.saturated_rate_per_s(), 2000, 1);
  EXPECT_LT(w.rate_per_s(), 200);
  // Saturated again, at 1,000 a second: it moves towards the new rate over about 10 s.
  for (int k = 0; k < 500; ++k) {
    t += 10'000'000;
    w.observe(t, 90, 10);
  }
  EXPECT_GT(w.saturated_rate_per_s(), 1000);
  EXPECT_LT(w.saturated_rate_per_s(), 1700);
  for (int k = 0; k < 5000; ++k) {
    t += 10'000'000;
    w.observe(t, 90, 10);
  }
  EXPECT_NEAR(w.saturated_rate_per_s(), 1000, 20);
}

}  // namespace
}  // namespace hr::queue
