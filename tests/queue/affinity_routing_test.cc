// Cache-aware dispatch's placement: stable per key, bounded per worker, moved only for a departed
// worker's keys.
#include "queue/affinity_routing.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace hr::queue {
namespace {

std::vector<std::optional<uint64_t>> keys_of(int n, uint64_t first = 1) {
  std::vector<std::optional<uint64_t>> keys;
  for (int i = 0; i < n; ++i) keys.push_back(first + static_cast<uint64_t>(i));
  return keys;
}

TEST(AffinityRoutingTest, OneKeyGoesToOneWorkerWhileItHasRoom) {
  const std::vector<std::string> workers = {"w1", "w2", "w3", "w4"};
  std::vector<std::optional<uint64_t>> keys(10, uint64_t{42});
  std::vector<int64_t> waiting;
  std::vector<int> to = route_by_affinity(keys, workers, &waiting, 100);
  for (int t : to) EXPECT_EQ(t, to[0]);
  EXPECT_NE(to[0], kSharedStream);
  EXPECT_EQ(waiting[static_cast<size_t>(to[0])], 10);
  // And the next pass places it the same way.
  std::vector<int64_t> later;
  EXPECT_EQ(route_by_affinity({uint64_t{42}}, workers, &later, 100)[0], to[0]);
}

TEST(AffinityRoutingTest, APopularKeySpillsToItsNextWorkersThenTheSharedStream) {
  const std::vector<std::string> workers = {"w1", "w2", "w3"};
  std::vector<std::optional<uint64_t>> keys(10, uint64_t{7});
  std::vector<int64_t> waiting = {0, 0, 0};
  std::vector<int> to = route_by_affinity(keys, workers, &waiting, 3);
  std::map<int, int> count;
  for (int t : to) ++count[t];
  EXPECT_EQ(count[0], 3);
  EXPECT_EQ(count[1], 3);
  EXPECT_EQ(count[2], 3);
  EXPECT_EQ(count[kSharedStream], 1);
  // What already waits counts against the cap.
  std::vector<int64_t> busy = {3, 3, 2};
  std::vector<int> one = route_by_affinity({uint64_t{7}}, workers, &busy, 3);
  EXPECT_EQ(one[0], 2);
}

TEST(AffinityRoutingTest, NoKeyOrNoWorkerGoesToTheSharedStream) {
  std::vector<int64_t> waiting;
  EXPECT_EQ(route_by_affinity({std::nullopt}, {"w1"}, &waiting, 10)[0], kSharedStream);
  EXPECT_EQ(route_by_affinity({uint64_t{1}}, {}, &waiting, 10)[0], kSharedStream);
}

TEST(AffinityRoutingTest, KeysSpreadOverWorkersAndADepartedWorkerMovesOnlyItsOwn) {
  const std::vector<std::string> four = {"w1", "w2", "w3", "w4"};
  const std::vector<std::string> three = {"w1", "w2", "w4"};  // w3 left
  std::vector<std::optional<uint64_t>> keys = keys_of(4000);
  std::vector<int64_t> a, b;
  std::vector<int> before = route_by_affinity(keys, four, &a, 1 << 30);
  std::vector<int> after = route_by_affinity(keys, three, &b, 1 << 30);
  for (int64_t n : a) {
    EXPECT_GT(n, 800);  // about a quarter each
    EXPECT_LT(n, 1200);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& was = four[static_cast<size_t>(before[i])];
    const std::string& now = three[static_cast<size_t>(after[i])];
    if (was != "w3") EXPECT_EQ(now, was) << "key " << *keys[i] << " moved without cause";
  }
}

TEST(AffinityRoutingTest, AccountsArePlacedIndependently) {
  std::set<uint64_t> seen;
  for (const char* account : {"a", "b", "c"}) seen.insert(routing_key(account, 12345));
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(routing_key("a", 12345), routing_key("a", 12345));
}

TEST(AffinityRoutingTest, TheCapIsAFairPartOfTheWindowAndAQuarter) {
  EXPECT_EQ(worker_stream_cap(400, 4), 125);
  EXPECT_EQ(worker_stream_cap(1, 4), 1);
  EXPECT_EQ(worker_stream_cap(100, 0), 0);
}

}  // namespace
}  // namespace hr::queue
