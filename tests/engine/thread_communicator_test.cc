// ThreadCommunicator (engine/thread_communicator.h): N ranks as threads. Every collective against
// a serial computation in rank order, bitwise equal on every rank, at 1, 2, 3, 4 and 8 ranks,
// many rounds in a row (a missing barrier shows as a wrong sum); sizes that differ between ranks
// are an error on every rank, not a hang; abort() ends the waits of ranks whose peer never comes.
#include "engine/thread_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace hr::engine {
namespace {

// Runs body(rank, comm) on one thread per rank.
void on_ranks(int n, const std::function<void(int, Communicator&)>& body) {
  auto group = ThreadCommunicator::create_group(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(r, *group[r]); });
  for (auto& t : threads) t.join();
}

std::vector<float> values(int rank, int round, size_t n) {
  std::mt19937 gen(static_cast<uint32_t>(rank * 7919 + round));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

class ThreadCommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadCommunicatorTest, CollectivesEqualTheSerialResultOnEveryRank) {
  const int n = GetParam();
  constexpr size_t kLen = 1000;
  constexpr int kRounds = 50;
  std::vector<std::vector<float>> reduced(static_cast<size_t>(n));
  std::vector<std::vector<float>> gathered(static_cast<size_t>(n));
  std::vector<std::vector<float>> scattered(static_cast<size_t>(n));
  std::vector<std::vector<float>> broadcasted(static_cast<size_t>(n));
  on_ranks(n, [&](int r, Communicator& comm) {
    EXPECT_EQ(comm.rank(), r);
    EXPECT_EQ(comm.size(), n);
    for (int round = 0; round < kRounds; ++round) {
      std::vector<float> v = values(r, round, kLen);
      ASSERT_TRUE(comm.all_reduce(v.data(), kLen).is_ok());
      std::vector<float> all(static_cast<size_t>(n) * kLen);
      std::vector<float> mine = values(r, round, kLen);
      ASSERT_TRUE(comm.all_gather(mine.data(), all.data(), kLen).is_ok());
      std::vector<float> piece(kLen / 10);
      std::vector<float> wide = values(r, round + 1000, static_cast<size_t>(n) * piece.size());
      ASSERT_TRUE(comm.reduce_scatter(wide.data(), piece.data(), piece.size()).is_ok());
      std::vector<float> b = values(r, round + 2000, kLen);
      ASSERT_TRUE(comm.broadcast(b.data(), kLen, round % n).is_ok());
      if (round == kRounds - 1) {
        reduced[static_cast<size_t>(r)] = v;
        gathered[static_cast<size_t>(r)] = all;
        scattered[static_cast<size_t>(r)] = piece;
        broadcasted[static_cast<size_t>(r)] = b;
      }
    }
  });
  const int last = kRounds - 1;
  // Serial, in rank order.
  std::vector<float> sum(kLen, 0.0f);
  for (int r = 0; r < n; ++r) {
    std::vector<float> v = values(r, last, kLen);
    for (size_t j = 0; j < kLen; ++j) sum[j] += v[j];
  }
  for (int r = 0; r < n; ++r) {
    const auto k = static_cast<size_t>(r);
    EXPECT_EQ(reduced[k], sum) << "rank " << r;  // bitwise, every rank
    for (int from = 0; from < n; ++from) {
      std::vector<float> v = values(from, last, kLen);
      EXPECT_TRUE(std::equal(v.begin(), v.end(), gathered[k].begin() + from * kLen));
    }
    std::vector<float> piece(kLen / 10, 0.0f);
    for (int from = 0; from < n; ++from) {
      std::vector<float> wide = values(from, last + 1000, static_cast<size_t>(n) * piece.size());
      for (size_t j = 0; j < piece.size(); ++j) piece[j] += wide[k * piece.size() + j];
    }
    EXPECT_EQ(scattered[k], piece) << "rank " << r;
    EXPECT_EQ(broadcasted[k], values(last % n, last + 2000, kLen)) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ThreadCommunicatorTest, ::testing::Values(1, 2, 3, 4, 8));

TEST(ThreadCommunicatorErrors, SizesThatDifferAreAnErrorOnEveryRankNotAHang) {
  std::vector<Status> got(4);
  on_ranks(4, [&](int r, Communicator& comm) {
    std::vector<float> v(16, 1.0f);
    got[static_cast<size_t>(r)] = comm.all_reduce(v.data(), r == 2 ? 8 : 16);
    // The group goes on working afterwards.
    std::vector<float> w(4, static_cast<float>(r));
    EXPECT_TRUE(comm.all_reduce(w.data(), 4).is_ok());
    EXPECT_EQ(w[0], 0.0f + 1 + 2 + 3);
    EXPECT_FALSE(comm.broadcast(w.data(), 4, 9).is_ok());
  });
  for (const Status& st : got) {
    EXPECT_FALSE(st.is_ok());
    EXPECT_EQ(st.field(), "all_reduce");
  }
}

// Point to point, as pipeline stages use it: a ring where each rank sends many messages of
// different sizes to the next before receiving from the previous; every message arrives whole,
// in order, and a receive of the wrong size or from no other rank is an error.
TEST(ThreadCommunicatorPointToPoint, MessagesArriveInOrderBetweenEachPair) {
  constexpr int kRanks = 4, kMessages = 100;
  on_ranks(kRanks, [&](int r, Communicator& comm) {
    const int next = (r + 1) % kRanks, prev = (r + kRanks - 1) % kRanks;
    for (int m = 0; m < kMessages; ++m) {
      std::vector<float> v(static_cast<size_t>(m % 7 + 1), static_cast<float>(r * 1000 + m));
      ASSERT_TRUE(comm.send(v.data(), v.size(), next).is_ok());
      v[0] = -1;  // the message was copied: changing the buffer changes nothing sent
    }
    for (int m = 0; m < kMessages; ++m) {
      std::vector<float> got(static_cast<size_t>(m % 7 + 1));
      ASSERT_TRUE(comm.recv(got.data(), got.size(), prev).is_ok());
      EXPECT_EQ(got, std::vector<float>(got.size(), static_cast<float>(prev * 1000 + m)));
    }
    std::vector<float> one(1);
    EXPECT_EQ(comm.send(one.data(), 1, r).field(), "send");
    EXPECT_EQ(comm.recv(one.data(), 1, kRanks).field(), "recv");
    ASSERT_TRUE(comm.send(one.data(), 1, next).is_ok());
    std::vector<float> two(2);
    EXPECT_EQ(comm.recv(two.data(), 2, prev).field(), "recv");  // one value sent, two asked
  });
}

// A rank that never comes (a stuck step): its peers wait in a collective, or for a message, until
// another thread aborts the group; then each wait ends with kInternal naming the reason, and every
// later call fails at once, on every rank.
TEST(ThreadCommunicatorAbort, EndsTheWaitsOfRanksWhosePeerNeverComes) {
  // Shared with the ranks' threads, which are left behind (still waiting) should the abort fail
  // to end their waits: the test then fails rather than hangs.
  struct Ranks {
    std::vector<std::unique_ptr<ThreadCommunicator>> group = ThreadCommunicator::create_group(3);
    std::vector<float> a = std::vector<float>(8, 1.0f), b = std::vector<float>(8, 2.0f),
                       m = std::vector<float>(4);
  };
  auto r = std::make_shared<Ranks>();
  auto on_thread = [r](std::function<Status(Ranks&)> call) {
    auto done = std::make_shared<std::promise<Status>>();
    std::future<Status> f = done->get_future();
    std::thread([r, call, done] { done->set_value(call(*r)); }).detach();
    return f;
  };
  // Rank 0 and rank 1 meet in an all-reduce that rank 2 never joins; rank 2 waits for a message
  // rank 0 never sends.
  std::future<Status> waits[] = {
      on_thread([](Ranks& x) { return x.group[0]->all_reduce(x.a.data(), 8); }),
      on_thread([](Ranks& x) { return x.group[1]->all_reduce(x.b.data(), 8); }),
      on_thread([](Ranks& x) { return x.group[2]->recv(x.m.data(), 4, 0); })};
  using namespace std::chrono_literals;
  EXPECT_EQ(waits[0].wait_for(200ms), std::future_status::timeout);  // waiting, as it should
  EXPECT_EQ(waits[2].wait_for(1ms), std::future_status::timeout);
  EXPECT_TRUE(r->group[1]->abort("step stuck for 300 s"));
  for (auto& f : waits) {
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
    const Status st = f.get();
    EXPECT_EQ(st.code(), StatusCode::kInternal);
    EXPECT_NE(st.message().find("step stuck for 300 s"), std::string::npos) << st.message();
  }
  // Spent: every later call of every rank fails at once (no rank is left to meet).
  for (auto& comm : r->group) {
    EXPECT_EQ(comm->all_reduce(r->a.data(), 8).code(), StatusCode::kInternal);
    EXPECT_EQ(comm->send(r->m.data(), 4, (comm->rank() + 1) % 3).code(), StatusCode::kInternal);
    EXPECT_EQ(comm->recv(r->m.data(), 4, (comm->rank() + 1) % 3).code(), StatusCode::kInternal);
  }
}

}  // namespace
}  // namespace hr::engine
