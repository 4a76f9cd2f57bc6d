// Names and helpers shared by the relay (dispatcher side) and the lease client (worker side) for
// the per-model Redis streams. Entries carry only ids ("b" batch, "i" index); the request body
// stays in Postgres.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "queue/pg.h"
#include "queue/redis.h"
#include "queue/store.h"

namespace hr::queue {

inline constexpr const char* kConsumerGroup = "hr-workers";

// The model's shared stream, read by every worker of the model.
std::string stream_key(const std::string& model);
// A worker's own stream (cache-aware dispatch): requests whose prompts start alike, which the
// relay sends to that worker while it lives. Its owner reads it before the shared stream; an idle
// worker takes from the others'. Same consumer group as the shared stream.
std::string worker_stream_key(const std::string& model, const std::string& worker);
// The set of workers of `model` that have a stream; the relay adds a worker when it creates the
// stream, and the janitor removes it when it moves a departed worker's entries back to the shared
// stream (move_worker_stream).
std::string worker_streams_key(const std::string& model);

// The model's catch-up stream: requests the relay gives an account far behind its share (a
// newcomer, say: queue/fair_share.h, ShareGrant::catch_up). Every worker reads it whatever its
// headroom and starts what it takes at once, ahead of the other queued work it runs (which its
// engine preempts). Same consumer group as the shared stream.
std::string catch_up_stream_key(const std::string& model);
// Set with every push to the catch-up stream: there but the stream gone, Redis lost the stream
// (its entries are sent again).
std::string catch_up_made_key(const std::string& model);

struct RequestRef {
  std::string batch_id;
  int idx = 0;
  bool operator==(const RequestRef&) const = default;
};

// Whether `model`'s stream has its consumer group.
[[nodiscard]] Result<bool> group_exists(RedisClient& redis, const std::string& model);
// Creates the consumer group (and the stream) if missing; idempotent. Only dispatchers call it
// (Dispatcher::ensure_stream): a group missing where entries should be is how they notice a
// stream that Redis lost (evicted, say), so nothing else may create it.
[[nodiscard]] Status create_group(RedisClient& redis, const std::string& model);
// Appends one entry per request to the model's shared stream, in one round trip.
[[nodiscard]] Status enqueue(RedisClient& redis, const std::string& model,
                             const std::vector<RequestRef>& refs);
// Appends one entry per request to `worker`'s stream, creating the stream and its group and
// listing the worker in worker_streams_key first, all in one transaction (so that the janitor's
// move_worker_stream sees all of it or none).
[[nodiscard]] Status enqueue_for_worker(RedisClient& redis, const std::string& model,
                                        const std::string& worker,
                                        const std::vector<RequestRef>& refs);
// Appends one entry per request to the model's catch-up stream, creating the stream and its
// group and setting catch_up_made_key first, in one transaction.
[[nodiscard]] Status enqueue_catch_up(RedisClient& redis, const std::string& model,
                                      const std::vector<RequestRef>& refs);
// The workers listed in worker_streams_key.
[[nodiscard]] Result<std::vector<std::string>> workers_with_streams(RedisClient& redis,
                                                                    const std::string& model);
// Moves every entry of `worker`'s stream, delivered or not, to the shared stream and deletes the
// stream and its listing, atomically (a script); returns the entries moved. For a worker that
// left: what was delivered to it is either leased in Postgres (and its copy is dropped by the
// claim) or was lost with it. The shared stream must have its group (else the moved entries are
// pushed again by the lost-stream rewind).
[[nodiscard]] Result<int64_t> move_worker_stream(RedisClient& redis, const std::string& model,
                                                 const std::string& worker);
// Pushes requests put back in the queue to `model`'s stream, then clears their push_pending
// (store.h); until then the janitor would push them again. A stream Redis lost is created anew by
// the push, without its group: a dispatcher then creates the group, from the first entry.
[[nodiscard]] Status push_requeued(RedisClient& redis, PgSession& pg, const std::string& model,
                                   const std::vector<Requeued>& requeued);
// Acknowledges and deletes entries of the stream `key` (after their outcome is committed in
// Postgres).
[[nodiscard]] Status ack_and_delete(RedisClient& redis, const std::string& key,
                                    const std::vector<std::string>& entry_ids);
// An entry read from a stream: its id and request (fields "b" and "i"; a malformed entry has an
// empty batch id).
struct StreamEntry {
  std::string id;
  RequestRef ref;
};
// The entries of one stream in an XRANGE, XREADGROUP or XAUTOCLAIM reply's list.
std::vector<StreamEntry> parse_entries(const RedisReply& list);

}  // namespace hr::queue
