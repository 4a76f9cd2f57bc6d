// The worker side of the queue: pull requests for one model from its Redis stream, take leases on
// them in Postgres (one statement for the whole pull), renew, complete, fail and release them.
// Every write after the pull is fenced by (batch, index, attempt): a stale worker whose lease was
// taken over can no longer change the request. Postgres commits first; then the stream entries are
// acknowledged and deleted. Not thread-safe: one LeaseClient per thread.
#pragma once

#include <pqxx/pqxx>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "queue/config.h"
#include "queue/pg.h"
#include "queue/redis.h"
#include "queue/stream.h"

namespace hr::queue {

struct LeaseOptions {
  std::string model;
  std::string owner;  // worker identity, also the Redis consumer name
  int lease_ms = 30000;
  int max_attempts = kDefaultMaxAttempts;  // a request that fails this often ends failed
};

struct Lease {
  RequestRef ref;
  int attempt = 0;
  int num_failures = 0;         // earlier failed attempts and expired leases
  std::string body;             // the request JSON
  std::string api_shape;        // "workers_ai" or "openai"
  std::string entry_id;         // Redis stream entry
  std::string stream;           // the stream it was read from (the shared one or a worker's)
  int64_t submitted_at_ms = 0;  // when its batch was submitted (for queue-time metrics)
  std::string account_id;       // whose batch (the prefix cache's namespace)
  bool catch_up = false;        // read from the catch-up stream: start it at once
};

struct Completion {
  Lease lease;
  std::string result_json;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
};

struct Failure {
  Lease lease;
  std::string code;
  std::string message;
  bool retryable = false;
};

class LeaseClient {
 public:
  [[nodiscard]] static Result<std::unique_ptr<LeaseClient>> create(const std::string& database_url,
                                                                   const std::string& redis_url,
                                                                   LeaseOptions options);

  // Reads up to `max` entries and leases the requests that are still queued: from the catch-up
  // stream first (queue/stream.h; those leases say catch_up), then this worker's own stream
  // (cache-aware dispatch, queue/affinity_routing.h), then the shared one, and
  // with nothing in either, from the other workers' own streams (so that no worker idles while
  // another's stream holds work). With nothing anywhere, waits up to `block_ms` on the shared
  // stream (0: no wait). Entries for requests that ended or are leased elsewhere are dropped.
  [[nodiscard]] Result<std::vector<Lease>> pull(int max, int block_ms);
  // Reads entries of the model's catch-up stream (queue/stream.h) and leases their requests as
  // pull() does; their leases say catch_up. Up to `max`, and no more than this worker's part of
  // what waits there when the model's live workers split it evenly (so that a newcomer's batch
  // runs on all of them).
  [[nodiscard]] Result<std::vector<Lease>> pull_catch_up(int max);
  // Extends the leases; returns the ones that were lost (taken over or ended) — stop working on
  // them.
  [[nodiscard]] Result<std::vector<RequestRef>> renew(const std::vector<Lease>& leases);
  // Records results. Returns, for each completion, whether it was accepted (false: fenced out).
  [[nodiscard]] Result<std::vector<bool>> complete(const std::vector<Completion>& completions);
  // Records failures: retryable ones go back to the queue until max_attempts, the rest end failed.
  [[nodiscard]] Result<std::vector<bool>> fail(const std::vector<Failure>& failures);
  // Hands back unstarted work: queued again, not counted as a failure.
  [[nodiscard]] Status release(const std::vector<Lease>& leases);

  const LeaseOptions& options() const { return options_; }

 private:
  LeaseClient(std::string database_url, std::unique_ptr<RedisClient> redis, LeaseOptions options);
  Status requeue(const std::vector<Lease>& leases, bool count_failure);
  // Ends `outcomes` (status per request) fenced by attempt and updates the batch counters.
  Result<std::vector<bool>> finish(const std::vector<Lease>& leases,
                                   const std::vector<std::string>& statuses,
                                   const std::vector<std::string>& results,
                                   const std::vector<std::string>& errors,
                                   const std::vector<std::array<int, 3>>& usage);

  // Up to `count` entries of `key` not yet delivered to the group, appended to `out` with the
  // stream they came from; waits up to block_ms (0: no wait). A stream without the group (not made
  // yet, or gone) has none.
  Status read_stream(const std::string& key, int count, int block_ms,
                     std::vector<std::pair<std::string, StreamEntry>>* out);
  // Reads, about once a second, which workers have streams of their own (this one among them or
  // not: until the relay has sent it work of its own, a pull does not look for any).
  Status read_listing();
  // Acknowledges and deletes the leases' entries, each in its own stream.
  Status ack(const std::vector<Lease>& leases);
  // Leases the requests of `entries` that are still queued; drops the entries of the rest.
  Result<std::vector<Lease>> claim(std::vector<std::pair<std::string, StreamEntry>>& entries);

  PgSession pg_;
  std::unique_ptr<RedisClient> redis_;
  LeaseOptions options_;
  std::vector<std::string> others_;  // the other workers with streams of their own
  bool own_listed_ = false;          // whether this worker has one
  int64_t listing_read_ns_ = 0;
  size_t steal_from_ = 0;  // where the next look at the others' streams starts (round robin)
  int live_workers_ = 1;   // the model's live workers (read about once a second)
  int64_t live_read_ns_ = 0;
};

}  // namespace hr::queue
