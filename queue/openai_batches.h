// The store side of the OpenAI Batch API, on the shared batch and request tables: reading batches
// with their OpenAI columns, recording a batch whose input failed validation (a row with status
// failed and its errors, nothing enqueued), reading results, and finalizing a finished batch
// (writing its output and error files once, rendered by wire/openai_batch_lines.h).
// Functions take a connection owned by the caller's thread; finalizing is safe to run in several
// processes at once (the batch row is locked with SKIP LOCKED).
#pragma once

#include <pqxx/pqxx>

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "queue/store.h"
#include "wire/openai_batch_lines.h"

namespace hr::queue {

struct OpenAiBatch {
  BatchInfo info;
  std::string account_id;
  std::optional<std::string> endpoint;
  std::optional<std::string> input_file_id;
  std::optional<std::string> output_file_id;
  std::optional<std::string> error_file_id;
  std::optional<std::string> errors_json;  // validation errors, {"object": "list", "data": [...]}
  std::optional<std::string> metadata_json;
  std::optional<std::string> completion_window;
  std::optional<int64_t> cancel_requested_at_ms;
  std::optional<int64_t> finalized_at_ms;
};

// kNotFound for another account's batch and for batches not created through the OpenAI API.
[[nodiscard]] Result<OpenAiBatch> get_openai_batch(pqxx::connection& conn,
                                                   const std::string& account_id,
                                                   const std::string& batch_id);

// The account's OpenAI batches, newest first, those older than `after` when given.
[[nodiscard]] Result<std::vector<OpenAiBatch>> list_openai_batches(
    pqxx::connection& conn, const std::string& account_id, int limit,
    const std::optional<std::string>& after);

struct FailedBatch {
  std::string account_id;
  std::string model;  // may be empty when no line named a served model
  std::string endpoint;
  std::string input_file_id;
  std::string completion_window;
  std::optional<std::string> metadata_json;
  std::string errors_json;
  // Its completion webhook, which gets the batch.failed event.
  std::optional<std::string> webhook_url;
  std::optional<std::vector<std::string>> webhook_events;
  std::optional<std::string> webhook_secret;
  // Retention, as NewBatch's.
  std::optional<int64_t> retain_seconds;
  int64_t default_retain_seconds = 30 * 86400;
};

// Stores a batch that failed validation: status failed, no requests, finished and finalized at
// once, with a batch.failed event. Returns its id.
[[nodiscard]] Result<std::string> record_failed_batch(pqxx::connection& conn,
                                                      const FailedBatch& batch);

// One ended request, as the output renderer (wire/openai_batch_lines.h) needs it.
using ResultRow = wire::StoredResult;

enum class ResultFilter { kSucceeded, kUnsucceeded };

// Ended requests of the batch matching `filter` with idx >= from_idx, in input order, at most
// `limit`.
[[nodiscard]] Result<std::vector<ResultRow>> read_result_rows(pqxx::connection& conn,
                                                              const std::string& batch_id,
                                                              ResultFilter filter, int from_idx,
                                                              int limit);

// Writes the output and error files of a finished OpenAI batch and marks it finalized, in one
// transaction. Returns false when there was nothing to do (not finished, already finalized, or
// being finalized by another process).
[[nodiscard]] Result<bool> finalize_openai_batch(pqxx::connection& conn,
                                                 const std::string& batch_id);

// Finalizes up to `max` finished OpenAI batches, taken in id order after `*cursor` (empty: from
// the first); returns how many this call finalized. Moves `*cursor` past the batches it looked at,
// and back to empty once it reaches the last, so that repeated calls visit every batch in turn:
// batches that cannot be finalized yet (locked by another process, or failing) never keep the rest
// waiting.
[[nodiscard]] Result<int> finalize_openai_batches(pqxx::connection& conn, int max,
                                                  std::string* cursor);

}  // namespace hr::queue
