// Sync inference for a standalone `api`: each call goes over HTTP to a live worker of its model,
// found in the Redis registry (queue/registry.h) that workers keep fresh with heartbeats.
//
// Placement: with x-session-affinity, rendezvous hashing over the live workers, so one value keeps
// landing on the same worker while it lives and moves to the next-ranked one when it dies;
// otherwise the least loaded worker with room (load compared in eighths of capacity, ties broken
// at random). A worker has room while
// the sync requests it holds stay below its capacity; its load is the larger of what it last
// announced and what this API has in flight to it, which covers the time between heartbeats.
// No worker with room: kResourceExhausted at once with reject_if_busy, else after waiting up to
// queue_timeout_ms. A worker that cannot be reached is skipped for a few seconds and the call
// moves on to the next one (before any of the answer has been passed on).
// Connections to workers are kept open between calls (HTTP/1.1 keep-alive): a call takes an idle
// one to its worker when there is one, and gives it back once the worker's answer has been read
// to its end. One the worker closed meanwhile is noticed before use, or costs one more try on a
// new connection; a sweep every second closes idle ones that workers closed or that sat too long.
// A call whose client leaves closes its connection, so that the worker stops.
// Thread-safe: run() and start_stream() are called from many handler threads at once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "api/sync_inference.h"
#include "api/worker_connections.h"
#include "queue/registry.h"

namespace hr::api {

// The order in which to try `workers` for one call: by rendezvous rank of `affinity` when it is
// set, else by load (in_flight[i] is this API's count for workers[i]); `seed` breaks ties.
std::vector<size_t> route_order(const std::vector<queue::WorkerInfo>& workers,
                                const std::vector<int>& in_flight, const std::string& affinity,
                                uint64_t seed);
// Whether `w` can take one more sync request given this API's `in_flight` to it.
bool has_room(const queue::WorkerInfo& w, int in_flight);

class WorkerRouter final : public SyncInference {
 public:
  explicit WorkerRouter(RouterOptions options);
  ~WorkerRouter() override;

  [[nodiscard]] Result<SyncAnswer> run(const wire::ChatRequest& request,
                                       const SyncCall& call) override;
  [[nodiscard]] Result<std::unique_ptr<wire::AnswerStream>> start_stream(
      const wire::ChatRequest& request, const SyncCall& call) override;

  struct Attempt;  // one call's choice of worker, released when the call ends

 private:
  struct ModelView {
    std::vector<queue::WorkerInfo> workers;
    int64_t fetched_ns = 0;
  };
  // Picks a worker for `call`, waiting for room as the call allows; `skip` lists worker ids that
  // already failed this call.
  Result<std::shared_ptr<Attempt>> place(const SyncCall& call,
                                         const std::vector<std::string>& skip);
  Result<std::vector<queue::WorkerInfo>> workers_of(const std::string& model);
  void suspect(const std::string& worker_id);
  std::string body_for(const wire::ChatRequest& request, const SyncCall& call, bool stream) const;
  // Sends `body` to a worker placed for `call`, moving on to the next one while workers cannot be
  // reached or hand the call on; on_ok(attempt, exchange) turns a 200 answer into the result
  // (kUnavailable from it: the worker broke off, try another).
  template <typename T, typename OnOk>
  Result<T> forward(const SyncCall& call, const std::string& body, OnOk on_ok);

  RouterOptions options_;
  std::mutex mu_;
  std::unique_ptr<queue::WorkerRegistry> registry_;   // guarded by mu_
  std::unordered_map<std::string, ModelView> views_;  // guarded by mu_
  std::unordered_map<std::string, int> in_flight_;    // worker id → calls; guarded by mu_
  std::unordered_map<std::string, int64_t> suspect_until_ns_;  // guarded by mu_
  uint64_t calls_ = 0;                                         // guarded by mu_
  WorkerConnections connections_{options_};
};

}  // namespace hr::api
