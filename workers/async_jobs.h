// Queued (async) requests in a worker's engine: each pulled lease becomes an engine request, and
// its answer, when it ends, a stored answer (wire/stored_answer.h) completed through the queue's
// I/O thread; an inference error hands it back as a retryable failure. Step loop only.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/tool_calls.h"
#include "queue/lease.h"
#include "workers/answer_logprobs.h"

namespace hr::workers {

class QueueIo;
class RequestSizes;
struct LoadedModel;

class AsyncJobs {
 public:
  AsyncJobs(engine::Engine& eng, QueueIo& io, LoadedModel& model, RequestSizes& sizes)
      : eng_(eng), io_(io), model_(model), sizes_(sizes) {}
  // Puts pulled requests into the engine; one it cannot take fails at once (not retried).
  void admit(const std::vector<queue::Lease>& arrived);
  // Stops working on leases taken over elsewhere (after a long stall, say).
  void drop_lost(const std::vector<int64_t>& lost);
  // On stop: the leases of requests that did not finish, cancelled in the engine, to hand back.
  std::vector<queue::Lease> take_unfinished();
  // Catch-up requests (queue/stream.h) in the engine, running or waiting.
  int catch_up_held() const { return catch_up_held_; }
  // The engine priority of catch-up requests: above every other queued request's (0), so that
  // the engine preempts those to start them.
  static constexpr int kCatchUpPriority = 1;

 private:
  void on_event(const engine::TokenEvent& ev);
  struct Running {
    queue::Lease lease;
    std::string text;
    AnswerLogprobs logprobs;
    engine::ToolCallFormat tool_calls;  // read out of the answer when tools were offered
    bool json = false;                  // a JSON document the response_format asked for
  };
  engine::Engine& eng_;
  QueueIo& io_;
  LoadedModel& model_;
  RequestSizes& sizes_;
  std::unordered_map<int64_t, Running> running_;  // engine id → lease
  int catch_up_held_ = 0;                         // of running_, with lease.catch_up
  void erase(std::unordered_map<int64_t, Running>::iterator it);
};

}  // namespace hr::workers
