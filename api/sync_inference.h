// The API's view of synchronous inference: something that runs one validated chat request now and
// returns its answer. In `serve` it is the in-process worker (an adapter in cmd/); in a standalone
// `api` it is the WorkerRouter (api/worker_router.h), which forwards to a live worker; the API
// never links the engine.
// Implementations are thread-safe: run() is called from many handler threads at once and blocks
// until the answer is ready, the deadline passes, or there is no capacity.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "queue/registry.h"
#include "wire/answer.h"
#include "wire/answer_stream.h"
#include "wire/chat_request.h"

namespace hr::api {

struct SyncAnswer {
  wire::Answer answer;
  std::string worker;  // which worker answered (empty in-process)
};

// How one sync call is to be placed and how long it may wait for room.
struct SyncCall {
  std::string model;
  // The client's x-session-affinity: calls with the same value go to the same worker while it
  // lives (its prefix cache holds their conversation). Empty: the least loaded worker.
  std::string affinity;
  bool reject_if_busy = false;  // no room: kResourceExhausted at once
  int queue_timeout_ms = 2000;  // otherwise wait this long for room, then kResourceExhausted
  // Polled while the call waits for room: true (the client went away) ends the wait with
  // kCancelled, so the call never takes a slot its answer could not reach. May be empty.
  std::function<bool()> client_gone;
  // Whose call it is (the account): a worker's prefix cache shares blocks only among calls of one
  // namespace, so no account learns from its cache hits what another has sent.
  std::string cache_namespace;
  // service_tier "flex": the call runs in the engine's async class, on whatever room sync calls
  // leave; it takes no sync room, and fails kResourceExhausted (field service_tier) when its
  // generation has not started within flex_timeout_ms.
  bool flex = false;
  int flex_timeout_ms = 600000;
};

class SyncInference {
 public:
  virtual ~SyncInference() = default;
  // Like run(), but the answer arrives as it is generated.
  [[nodiscard]] virtual Result<std::unique_ptr<wire::AnswerStream>> start_stream(
      const wire::ChatRequest& request, const SyncCall& call) = 0;
  // kResourceExhausted when there is no room (at once with call.reject_if_busy, else after
  // waiting call.queue_timeout_ms); kInvalidArgument for a request the model cannot take (e.g.
  // too long), naming the field.
  [[nodiscard]] virtual Result<SyncAnswer> run(const wire::ChatRequest& request,
                                               const SyncCall& call) = 0;
  // Workers in this process, as they would announce themselves (for the operator's view; the
  // registry holds the others). None by default.
  virtual std::vector<queue::WorkerInfo> local_workers() const { return {}; }
};

}  // namespace hr::api
