// A worker: one engine instance that pulls async requests for its model from the queue only into
// the headroom the engine reports (workers/headroom_policy.h), runs them, and records each result
// in the queue; sync requests handed to it run first. Leases are renewed while requests run; on
// stop, unstarted work is released and running work is finished within the drain deadline or
// released.
// Thread-safety: start()/stop() from any one thread; run() and start_stream() from many handler
// threads; everything else runs on the worker's own step-loop thread, which owns the engine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "queue/config.h"
#include "wire/answer.h"
#include "wire/answer_stream.h"
#include "wire/chat_request.h"
#include "workers/worker_config.h"

namespace hr::engine {
class Backend;
}  // namespace hr::engine

namespace hr::workers {

struct LoadedModel;
struct SyncJob;
class ActiveSync;

struct WorkerStats {
  std::atomic<int64_t> pulled{0};
  std::atomic<int64_t> caught_up{0};  // of them, from the catch-up stream (queue/stream.h)
  std::atomic<int64_t> completed{0};
  std::atomic<int64_t> failed{0};
  std::atomic<int64_t> released{0};
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> streams_cancelled{0};
  std::atomic<int64_t> calls_cancelled{0};  // sync answers not streamed, their client gone
  std::atomic<int64_t> braked{0};           // pulls held back by the utilization brake
};

// What the worker announces to the API's router (queue/registry.h), as of the last engine step.
struct WorkerLoad {
  int capacity = 0;   // sync requests it can run at once
  int sync_load = 0;  // sync requests it holds (queued for the step loop, waiting or running)
  int async_running = 0;
  int free_kv_blocks = 0;
  int total_kv_blocks = 0;
  double utilization = 0;
  bool stopping = false;
};

// How one sync request waits for room.
struct SyncOptions {
  bool reject_if_busy = false;  // no room: kResourceExhausted at once
  int queue_timeout_ms = 2000;  // otherwise wait this long for room
  // Polled while the request waits: true (the client went away) ends it with kCancelled. May be
  // empty.
  std::function<bool()> client_gone;
  // Whose request it is (the account): the prefix cache's namespace (engine::GenerationRequest).
  std::string cache_namespace;
  // service_tier "flex": generated in the engine's async class, on the room sync requests leave,
  // taking no sync slot; kResourceExhausted (field service_tier) when its generation has not
  // started within flex_timeout_ms.
  bool flex = false;
  int flex_timeout_ms = 600000;
};

class Worker final {
 public:
  // Loads the model (weights, tokenizer, chat template) and builds the engine, on `backend` when
  // one is given (else the one the config names).
  [[nodiscard]] static Result<std::unique_ptr<Worker>> create(
      const WorkerConfig& config, const queue::StoreConfig& store,
      std::shared_ptr<engine::Backend> backend = nullptr);
  // Engine steps failing in a row (50 ms apart, then 100) after which the worker gives up on
  // what it holds: every request ends (sync ones with an error, async ones handed back to the
  // queue as a retryable failure). When the failure is the device's (kInternal: a CUDA error,
  // say) it also stops, and `on_failure` runs; otherwise it goes on with a clean engine.
  static constexpr int kMaxFailedSteps = 3;
  // How long the watchdog waits for the queue I/O thread to write a stuck loop's leases back.
  static constexpr int kHandBackWaitMs = 10000;
  // stop()'s allowance past the drain, a step's time and that hand-back.
  static constexpr int kStopMarginMs = 5000;
  ~Worker();

  [[nodiscard]] Status start();
  // The first step of shutting down, before the sync requests in flight are waited for: pulls no
  // more async work and takes no new sync request (they go to other workers). Thread-safe.
  void begin_drain() { draining_ = true; }
  // Stops pulling; finishes running async requests until `drain_seconds`, then releases the rest.
  void stop();
  const WorkerStats& stats() const { return stats_; }
  // Runs one sync request on this worker's engine, ahead of async work (thread-safe).
  // kResourceExhausted when there is no room (see SyncOptions), kInvalidArgument naming the field
  // for a request the model cannot take, kUnavailable when the engine failed it.
  [[nodiscard]] Result<wire::Answer> run(const wire::ChatRequest& request,
                                         const SyncOptions& options);
  // Like run(), but the answer arrives as it is generated.
  [[nodiscard]] Result<std::unique_ptr<wire::AnswerStream>> start_stream(
      const wire::ChatRequest& request, const SyncOptions& options);
  // The model's context length (for the API's validation in `serve`).
  int context_length() const;
  const WorkerConfig& config() const { return config_; }
  WorkerLoad load() const;
  // Called once when the engine gave up (see kMaxFailedSteps), from the step loop, or when a step
  // ran past config.step_timeout_seconds, from the step watchdog's thread (the work handed back
  // first; see stuck()): the process should exit, so that whatever supervises it starts a fresh
  // one. Set before start().
  void set_on_failure(std::function<void()> f) { on_failure_ = std::move(f); }
  // Whether the engine gave up (or got stuck).
  bool failed() const { return failed_.load(); }
  // Whether a step ran past config.step_timeout_seconds (workers/step_watchdog.h): its sync calls
  // were failed, its leases handed back as retryable failures and the engine's ranks aborted.
  bool stuck() const { return stuck_.load(); }
  // After stop(): the step loop was still stuck, and its thread was left running. The thread
  // still uses the worker, so its destructor then ends the process (exit status 1) rather than
  // free what the thread uses; every lease was handed back when the step got stuck.
  bool loop_abandoned() const { return loop_abandoned_; }

 private:
  Worker(WorkerConfig config, queue::StoreConfig store);
  struct Loop;  // the step loop's state and phases (worker.cc)
  void loop();
  // The sync jobs handed in since the last call.
  std::vector<std::shared_ptr<SyncJob>> take_inbox();
  // Waits for a sync arrival or for news from the queue I/O thread, at most `ms`.
  void wait_for_work(int ms);
  // Ends every sync call handed in and not yet answered with `st`, and takes no more.
  void fail_sync_calls(const Status& st);
  // Runs on_failure_, once.
  void report_failure();

  WorkerConfig config_;
  queue::StoreConfig store_;
  std::unique_ptr<LoadedModel> model_;
  // Queues a sync job for the step loop; kResourceExhausted once the loop has ended.
  Status hand_to_step_loop(const std::shared_ptr<SyncJob>& job);
  // Counts one more sync request in sync_active_ (the caller's ActiveSync gives it back).
  // kResourceExhausted, counting nothing, when stopping, or (with reject_if_busy) when sync
  // requests fill every slot.
  Status take_sync_slot(bool reject_if_busy);
  // A sync call's slot, or a flex call's count (flex_active_: it takes no sync slot).
  Result<ActiveSync> take_slot(const SyncOptions& options);
  // The step loop's job for a call: its generation request, class and, for flex, its deadline.
  Result<std::shared_ptr<SyncJob>> make_job(const wire::ChatRequest& request,
                                            const SyncOptions& options);
  std::mutex inbox_mu_;
  std::vector<std::shared_ptr<SyncJob>> inbox_;  // guarded by inbox_mu_
  std::condition_variable inbox_cv_;             // signalled when inbox_ gains a job
  bool io_ready_ = false;                        // guarded by inbox_mu_: queue I/O has news
  bool inbox_closed_ = false;                    // guarded by inbox_mu_: the step loop has ended
  // Every sync job handed in (finished ones expire), so that a stuck loop's can be failed
  // from elsewhere. Guarded by inbox_mu_; expired entries pruned as it grows.
  std::vector<std::weak_ptr<SyncJob>> handed_in_;
  size_t prune_handed_in_at_ = 64;
  std::atomic<int> sync_active_{0};    // sync requests between admit and their end
  std::atomic<int> flex_active_{0};    // flex calls between admit and their end
  std::atomic<int> async_running_{0};  // as of the last step
  std::atomic<int> free_kv_blocks_{0};
  std::atomic<int> total_kv_blocks_{0};
  std::atomic<double> utilization_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};  // begin_drain(): no new work, running work goes on
  std::atomic<bool> failed_{false};
  std::atomic<bool> stuck_{false};
  std::atomic<bool> failure_reported_{false};
  std::function<void()> on_failure_;
  std::mutex loop_mu_;
  std::condition_variable loop_cv_;
  bool loop_ended_ = false;     // guarded by loop_mu_
  bool stuck_handled_ = false;  // guarded by loop_mu_: the watchdog handed the work back
  bool loop_abandoned_ = false;
  std::thread thread_;
  WorkerStats stats_;
};

}  // namespace hr::workers
