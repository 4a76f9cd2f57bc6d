// The dispatcher's duties, each one safe to run in several processes at once:
//  - relay: pushes committed, not yet dispatched requests from Postgres into the per-model Redis
//    streams, advancing a per-batch cursor (a crash between XADD and the cursor's update only
//    duplicates entries, and duplicates are dropped when a worker fails to lease them); it holds
//    no row lock while it talks to Redis (see relay_once). Each stream is a short ready-queue
//    (relay_window.h) and what enters it is chosen by weighted fair share over accounts and
//    then priority and deadline within each (fair_share.h); the backlog stays in Postgres. One
//    dispatcher at a time relays a model (an advisory lock per model);
//  - janitor: re-queues requests whose lease expired (or fails them after max attempts), expires
//    requests of batches past their deadline, and reclaims stream entries stuck in a dead
//    consumer's pending list;
//  - finalize: writes the output and error files of finished OpenAI batches;
//  - retention: keeps the requests partitions ready ahead of time and purges expired and deleted
//    batches and files (queue/retention.h), every purge_interval_ms;
//  - resync: notices a Redis that restarted or lost its data (run id / epoch marker) and rewinds
//    every open batch's cursor so the relay re-sends everything still queued.
// Not thread-safe: one Dispatcher per thread.
#pragma once

#include <pqxx/pqxx>

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "queue/config.h"
#include "queue/pg.h"
#include "queue/redis.h"
#include "queue/relay_window.h"
#include "queue/retention.h"
#include "queue/store.h"

namespace hr::queue {

struct DispatcherOptions {
  std::string name = "dispatcher";  // consumer name used when reclaiming entries
  RelayWindowOptions window;        // how much each model's stream holds ahead
  int relay_poll_ms = 10;           // while work waits for room: how often to look
  int newcomer_check_ms = 50;  // and how often, short of room, to look for a newcomer owed some
  // false: first in, first out, as before the fair share (the stream holds every request, oldest
  // batch first): for comparisons.
  bool fair_share = true;
  // Cache-aware dispatch: requests whose prompts start alike go to one live worker's own stream
  // (queue/affinity_routing.h); false: every request to the shared stream.
  bool dispatch_by_prefix = true;
  // An account whose work in flight per weight is below this fraction of another's (a newcomer,
  // say) gets its share through the catch-up stream, which workers start at once by preempting
  // other queued work (queue/stream.h); 0: never.
  double catch_up_below = 0.5;
  int max_attempts = kDefaultMaxAttempts;  // failed attempts before a request ends failed
  int reclaim_idle_ms = 60000;             // pending entries idle this long are reclaimed
  int tick_ms = 500;                       // janitor period in run()
  int purge_interval_ms = 5000;            // retention's period (0: never)
  RetentionOptions retention;
};

struct TickReport {
  int relayed = 0;
  int requeued = 0;
  int failed = 0;
  int expired = 0;
  int reclaimed = 0;
  int cancelled = 0;  // requests of cancelled batches put back in the queue after the cancel
  int pushed = 0;     // requests put back in the queue whose push had not happened
  int finalized = 0;
  bool resynced = false;
  PurgeReport purged;  // when the retention duty ran in this tick
};

class Dispatcher {
 public:
  [[nodiscard]] static Result<std::unique_ptr<Dispatcher>> create(const std::string& database_url,
                                                                  const std::string& redis_url,
                                                                  DispatcherOptions options);

  // One relay pass over every model with requests not yet sent; returns how many it pushed.
  [[nodiscard]] Result<int> relay_once();
  // Whether the last relay pass left requests behind for want of room in a stream (or for a
  // later pass): run() then looks again after relay_poll_ms rather than a tick.
  bool relay_waiting() const { return relay_waiting_; }
  // Creates `model`'s stream and group if missing (true when it did); if batches of the model had
  // been pushed to it, Redis lost them, and their cursors are rewound first so that they are sent
  // again.
  // Looks at Redis once per model per tick (or since the last tick); after that it answers false.
  [[nodiscard]] Result<bool> ensure_stream(const std::string& model);
  // Returns {requeued, failed}.
  [[nodiscard]] Result<std::pair<int, int>> requeue_expired_leases();
  [[nodiscard]] Result<int> expire_deadlines();
  [[nodiscard]] Result<bool> resync_if_redis_lost();
  // Moves departed and draining workers' own streams back to the shared stream, and reclaims
  // entries delivered but idle for reclaim_idle_ms in every stream of the model (pushed again
  // to the shared stream when their requests are still queued). Returns the entries handled.
  [[nodiscard]] Result<int> reclaim_idle_entries();
  // Pushes requests put back in the queue whose push is not known to have happened (a Redis error
  // or a crash after the commit: push_pending), then clears the mark.
  [[nodiscard]] Result<int> push_requeued();
  // Ends as cancelled the requests of cancelled batches that went back to the queue after the
  // cancel (a lease that expired, a retryable failure, a release), so that the batch ends.
  [[nodiscard]] Result<int> cancel_requeued();
  // Writes the files of finished OpenAI batches; returns how many were finalized.
  [[nodiscard]] Result<int> finalize_openai_batches();
  // Creates the partitions due and runs one pass of the purge.
  [[nodiscard]] Result<PurgeReport> retain();
  // One pass of every duty (relay until caught up; retention when it is due).
  [[nodiscard]] Result<TickReport> tick();
  // Runs tick() until `stop`, waking early on NOTIFY hr_dispatch. Errors are logged and retried.
  void run(const std::atomic<bool>& stop);

 private:
  Dispatcher(std::string database_url, std::unique_ptr<RedisClient> redis,
             DispatcherOptions options);
  // ensure_stream(), logging a failure: false when the model's stream cannot be used this tick (a
  // key of another type, say), so that the other models go on.
  bool stream_ready(const std::string& model);
  // One model's share of a relay pass.
  [[nodiscard]] Result<int> relay_model(const std::string& model);
  // Rewinds the cursors of the model's open batches, under its relay lock, so that what was sent
  // is sent again (after Redis lost a stream); returns the batches rewound.
  [[nodiscard]] Result<int> rewind(const std::string& model);
  // The live workers a model's requests may be sent to by affinity (read about once a second).
  [[nodiscard]] Result<std::vector<std::string>> routable_workers(const std::string& model);
  // Moves the streams of a model's departed and draining workers back to its shared stream
  // (adding the entries moved to `moved`), and rewinds the model if a listed stream was lost;
  // returns the live workers whose streams stay (read once per tick).
  [[nodiscard]] Result<std::vector<std::string>> reclaim_worker_streams(const std::string& model,
                                                                        int64_t* moved);
  // Rewinds the model if its catch-up stream was made (catch_up_made_key) but is gone.
  [[nodiscard]] Status check_catch_up_stream(const std::string& model);

  std::string database_url_;
  PgSession pg_;
  std::unique_ptr<RedisClient> redis_;
  DispatcherOptions options_;
  std::string finalize_cursor_;  // the last OpenAI batch finalize_openai_batches() looked at
  std::set<std::string> streams_checked_;             // models ensure_stream looked at in this tick
  int64_t next_purge_ns_ = 0;                         // steady time the retention duty is due
  std::map<std::string, RelayWindow> windows_;        // per model
  std::map<std::string, int64_t> last_full_pass_ns_;  // per model: its last pass past the room
  std::map<std::string, int64_t> pushed_since_;       // per model: pushed since its window looked
  std::map<std::string, int64_t> rate_published_ns_;  // per model: its rate last written
  struct LiveWorkers {
    std::vector<std::string> ids;
    int64_t read_ns = 0;
  };
  std::map<std::string, LiveWorkers> live_;  // per model, for cache-aware dispatch
  bool relay_waiting_ = false;
};

}  // namespace hr::queue
