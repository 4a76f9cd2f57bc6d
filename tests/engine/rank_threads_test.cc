// A thread per rank (engine/rank_threads.h): taking turns, only the rank holding the turn runs,
// the turn goes round in rank order at every pass, a failing rank ends the run with its error on
// every rank, and the threads serve run after run; ranks of their own run at once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "engine/rank_threads.h"

namespace hr::engine {
namespace {

TEST(RankThreadsTest, RanksRunOneAtATimeInRankOrderAtEveryPass) {
  for (int size : {1, 2, 3, 8}) {
    RankThreads turns(size, true);
    for (int run = 0; run < 3; ++run) {
      std::vector<int> order;  // written only by the rank holding the turn
      std::atomic<int> running{0};
      std::atomic<bool> overlapped{false};
      auto segment = [&](int r) {
        if (running.fetch_add(1) != 0) overlapped = true;
        order.push_back(r);
        running.fetch_sub(1);
      };
      Status st = turns.run([&](int r) {
        for (int p = 0; p < 4; ++p) {
          segment(r);
          HR_RETURN_IF_ERROR(turns.pass(r));
        }
        segment(r);
        return Status::ok();
      });
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      EXPECT_FALSE(overlapped);
      ASSERT_EQ(order.size(), static_cast<size_t>(5 * size));
      for (size_t i = 0; i < order.size(); ++i)
        EXPECT_EQ(order[i], static_cast<int>(i) % size) << "segment " << i;
    }
  }
}

TEST(RankThreadsTest, AFailingRankEndsTheRunWithItsErrorOnEveryRank) {
  RankThreads turns(4, true);
  std::mutex mu;
  std::vector<std::string> seen(4);
  Status st = turns.run([&](int r) -> Status {
    Status passed = turns.pass(r);
    if (passed.is_ok() && r == 2) return invalid_argument("rank 2 cannot", "tensor-parallel");
    if (passed.is_ok()) passed = turns.pass(r);
    std::lock_guard<std::mutex> lock(mu);
    seen[static_cast<size_t>(r)] = passed.to_string();
    return passed;
  });
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.field(), "tensor-parallel");
  for (int r : {0, 1, 3})
    EXPECT_NE(seen[static_cast<size_t>(r)].find("rank 2 cannot"), std::string::npos) << r;
  // The next run starts afresh.
  std::atomic<int> ran{0};
  EXPECT_TRUE(turns
                  .run([&](int) {
                    ++ran;
                    return Status::ok();
                  })
                  .is_ok());
  EXPECT_EQ(ran.load(), 4);
}

TEST(RankThreadsTest, RanksOfTheirOwnRunAtOnce) {
  RankThreads ranks(4, false);
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  // Every rank waits for all four to have started: only ranks running at once get past it.
  Status st = ranks.run([&](int) {
    std::unique_lock<std::mutex> lock(mu);
    ++arrived;
    cv.notify_all();
    if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return arrived == 4; }))
      return internal_error("the ranks did not run at once");
    return Status::ok();
  });
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_FALSE(ranks.run([&](int r) { return ranks.pass(r); }).is_ok());
}

TEST(RankThreadsTest, PassingOutOfTurnIsAnError) {
  RankThreads turns(2, true);
  Status st = turns.run([&](int r) { return r == 0 ? turns.pass(1) : Status::ok(); });
  EXPECT_FALSE(st.is_ok());
}

}  // namespace
}  // namespace hr::engine
