// A batch's life after it ends: deleting it and retrying what did not succeed. Expiry and the
// removal of rows are retention.h's. Functions take a connection owned by the caller's thread.
#pragma once

#include <pqxx/pqxx>

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "queue/store.h"

namespace hr::queue {

// Deletes a batch that has ended: polls answer not found at once (its output files go too), and
// the purge removes its rows (queue/retention.h). kConflict naming the state when it has not
// ended; kNotFound when it is not there (or already deleted or expired).
[[nodiscard]] Status delete_batch(pqxx::connection& conn, const std::string& account_id,
                                  const std::string& batch_id);

struct RetryRequest {
  std::string account_id;
  std::string batch_id;  // the batch whose failed, expired and cancelled requests run again
  // Replays the retry made with the same key (for this batch) instead of making another.
  std::optional<std::string> idempotency_key;
  // The new batch's completion webhook, when the retry names one (checked by the caller); else
  // the original's.
  bool webhook_given = false;
  std::optional<std::string> webhook_url;
  std::optional<std::vector<std::string>> webhook_events;
  std::optional<std::string> webhook_secret;
};

// A new batch of the failed, expired and cancelled requests of an ended batch, in their order,
// with their custom ids, numbered from 0; it keeps the original's model, shape, metadata, webhook
// (unless the retry names one),
// retention and completion window (from now), and records retried_from. kConflict when the batch
// has not ended or has nothing to retry.
[[nodiscard]] Result<SubmitResult> retry_batch(pqxx::connection& conn, const RetryRequest& retry);

}  // namespace hr::queue
