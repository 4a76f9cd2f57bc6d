// The in-process worker as the API's sync inference.
#include "cmd/worker_sync.h"

#include <utility>

#include "workers/sync_server.h"

namespace hr::cmd {

namespace {

workers::SyncOptions options_of(const api::SyncCall& call) {
  workers::SyncOptions o;
  o.reject_if_busy = call.reject_if_busy;
  o.queue_timeout_ms = call.queue_timeout_ms;
  o.client_gone = call.client_gone;
  o.cache_namespace = call.cache_namespace;
  o.flex = call.flex;
  o.flex_timeout_ms = call.flex_timeout_ms;
  return o;
}

}  // namespace

Result<api::SyncAnswer> WorkerSync::run(const wire::ChatRequest& request,
                                        const api::SyncCall& call) {
  HR_ASSIGN_OR_RETURN(wire::Answer answer, worker_.run(request, options_of(call)));
  return api::SyncAnswer{std::move(answer), ""};
}

Result<std::unique_ptr<wire::AnswerStream>> WorkerSync::start_stream(
    const wire::ChatRequest& request, const api::SyncCall& call) {
  return worker_.start_stream(request, options_of(call));
}

std::vector<queue::WorkerInfo> WorkerSync::local_workers() const {
  return {workers::describe_worker(worker_, "", false)};
}

}  // namespace hr::cmd
