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

std::string stream_key(const std::string& model);

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
// Appends one entry per request, in one round trip.
[[nodiscard]] Status enqueue(RedisClient& redis, const std::string& model,
                             const std::vector<RequestRef>& refs);
// Pushes requests put back in the queue to `model`'s stream, then clears their push_pending
// (store.h); until then the janitor would push them again. A stream Redis lost is created anew by
// the push, without its group: a dispatcher then creates the group, from the first entry.
[[nodiscard]] Status push_requeued(RedisClient& redis, PgSession& pg, const std::string& model,
                                   const std::vector<Requeued>& requeued);
// Acknowledges and deletes entries (after their outcome is committed in Postgres).
[[nodiscard]] Status ack_and_delete(RedisClient& redis, const std::string& model,
                                    const std::vector<std::string>& entry_ids);

}  // namespace hr::queue
