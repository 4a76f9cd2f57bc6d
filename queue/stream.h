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

// Creates the consumer group (and the stream) if missing; idempotent.
[[nodiscard]] Status ensure_group(RedisClient& redis, const std::string& model);
// Appends one entry per request, in one round trip.
[[nodiscard]] Status enqueue(RedisClient& redis, const std::string& model,
                             const std::vector<RequestRef>& refs);
// Pushes requests put back in the queue to `model`'s stream (creating it if Redis lost it), then
// clears their push_pending (store.h); until then the janitor would push them again.
[[nodiscard]] Status push_requeued(RedisClient& redis, PgSession& pg, const std::string& model,
                                   const std::vector<Requeued>& requeued);
// Acknowledges and deletes entries (after their outcome is committed in Postgres).
[[nodiscard]] Status ack_and_delete(RedisClient& redis, const std::string& model,
                                    const std::vector<std::string>& entry_ids);

}  // namespace hr::queue
