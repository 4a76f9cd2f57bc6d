// Placement of sync calls: rendezvous hashing for x-session-affinity (stable, spread, and only the
// dead worker's keys move when it leaves) and least-loaded order without it.
#include "api/worker_router.h"

#include <gtest/gtest.h>

#include <map>

namespace hr::api {
namespace {

queue::WorkerInfo worker(const std::string& id, int capacity = 8, int sync_load = 0,
                         int async_running = 0) {
  queue::WorkerInfo w;
  w.id = id;
  w.url = "http://127.0.0.1:1";
  w.capacity = capacity;
  w.sync_load = sync_load;
  w.async_running = async_running;
  return w;
}

std::string owner(const std::vector<queue::WorkerInfo>& ws, const std::string& key, uint64_t seed) {
  return ws[route_order(ws, std::vector<int>(ws.size(), 0), key, seed)[0]].id;
}

TEST(WorkerRouterTest, AffinityKeepsAKeyOnOneWorkerWhateverTheLoad) {
  std::vector<queue::WorkerInfo> ws = {worker("a"), worker("b"), worker("c")};
  for (int k = 0; k < 50; ++k) {
    std::string key = "session-" + std::to_string(k);
    std::string first = owner(ws, key, 1);
    // Other seeds, other loads, another order of the list: the same owner.
    std::vector<queue::WorkerInfo> shuffled = {ws[2], ws[0], ws[1]};
    shuffled[0].sync_load = 7;
    EXPECT_EQ(owner(shuffled, key, 99), first) << key;
    EXPECT_EQ(owner(ws, key, 12345), first) << key;
  }
}

TEST(WorkerRouterTest, AffinityKeysSpreadAndOnlyTheLostWorkersKeysMove) {
  std::vector<queue::WorkerInfo> ws = {worker("a"), worker("b"), worker("c"), worker("d")};
  std::map<std::string, int> per_worker;
  std::map<std::string, std::string> before;
  for (int k = 0; k < 4000; ++k) {
    std::string key = "user-" + std::to_string(k);
    before[key] = owner(ws, key, 0);
    ++per_worker[before[key]];
  }
  ASSERT_EQ(per_worker.size(), 4u);
  for (const auto& [id, n] : per_worker) {
    EXPECT_GT(n, 800) << id;  // about 1000 each
    EXPECT_LT(n, 1200) << id;
  }
  std::vector<queue::WorkerInfo> without_b = {ws[0], ws[2], ws[3]};
  int moved = 0;
  for (const auto& [key, was] : before) {
    std::string now = owner(without_b, key, 0);
    if (was == "b") {
      EXPECT_NE(now, "b");
      ++moved;
    } else {
      EXPECT_EQ(now, was) << key;  // keys of live workers stay put
    }
  }
  EXPECT_EQ(moved, per_worker["b"]);
}

TEST(WorkerRouterTest, WithoutAffinityTheLeastLoadedComesFirst) {
  std::vector<queue::WorkerInfo> ws = {worker("busy", 8, 6), worker("idle", 8, 0),
                                       worker("half", 8, 4), worker("big", 32, 8)};
  std::vector<int> in_flight = {0, 0, 0, 0};
  std::vector<size_t> order = route_order(ws, in_flight, "", 7);
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(ws[order[0]].id, "idle");
  EXPECT_EQ(ws[order[1]].id, "big");  // 8/32 in use
  EXPECT_EQ(ws[order[2]].id, "half");
  EXPECT_EQ(ws[order[3]].id, "busy");
  // This API's own calls in flight count when they exceed the announced load.
  in_flight = {0, 5, 0, 0};
  EXPECT_EQ(ws[route_order(ws, in_flight, "", 7)[0]].id, "big");
}

TEST(WorkerRouterTest, EqualLoadPrefersFewerAsyncSequencesThenSpreadsAtRandom) {
  std::vector<queue::WorkerInfo> ws = {worker("x", 8, 1, 5), worker("y", 8, 1, 2)};
  EXPECT_EQ(ws[route_order(ws, {0, 0}, "", 3)[0]].id, "y");
  std::vector<queue::WorkerInfo> twins = {worker("p"), worker("q")};
  std::map<std::string, int> first;
  for (uint64_t seed = 0; seed < 200; ++seed)
    ++first[twins[route_order(twins, {0, 0}, "", seed)[0]].id];
  EXPECT_GT(first["p"], 50);
  EXPECT_GT(first["q"], 50);
}

TEST(WorkerRouterTest, LoadDifferencesBelowAnEighthOfCapacitySpreadAtRandom) {
  // A heartbeat-old load of 1 in 32 must not send every call to the other worker.
  std::vector<queue::WorkerInfo> ws = {worker("p", 32, 1), worker("q", 32, 0)};
  std::map<std::string, int> first;
  for (uint64_t seed = 0; seed < 200; ++seed) ++first[ws[route_order(ws, {0, 0}, "", seed)[0]].id];
  EXPECT_GT(first["p"], 50);
  EXPECT_GT(first["q"], 50);
  ws[0].sync_load = 4;  // an eighth: now it counts
  for (uint64_t seed = 0; seed < 50; ++seed)
    EXPECT_EQ(ws[route_order(ws, {0, 0}, "", seed)[0]].id, "q");
}

TEST(WorkerRouterTest, RoomIsCapacityMinusTheLargerLoad) {
  queue::WorkerInfo w = worker("w", 4, 3);
  EXPECT_TRUE(has_room(w, 0));
  EXPECT_TRUE(has_room(w, 3));
  EXPECT_FALSE(has_room(w, 4));
  w.sync_load = 4;
  EXPECT_FALSE(has_room(w, 0));
  w.sync_load = 0;
  w.draining = true;
  EXPECT_FALSE(has_room(w, 0));
}

}  // namespace
}  // namespace hr::api
