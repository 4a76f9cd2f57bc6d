// Retention: how the store's size stays a function of the retention window, not of its age.
//  - The requests table is partitioned by ranges of batch_id (migrations/0007): batches created in
//    one interval (--partition-interval, a day) keep their requests in one partition.
//    ensure_request_partitions() creates the partitions ahead of time and moves into a new
//    partition any rows the default partition caught meanwhile.
//  - purge_expired() drops a partition whole once every batch created in its interval has expired
//    or been deleted, then removes what is left of such batches (their rows in the batch, outbox,
//    webhook and file tables); requests of a batch deleted by its client, or of one whose
//    partition stays (a neighbour lives on), are deleted in bounded chunks instead.
//  - Expired and deleted files and their chunks go too.
// Every step is a short transaction (DDL waits at most lock_timeout_ms for its lock and is tried
// again on the next pass), and a batch row goes last, after its requests: a purge that stops
// half-way (a crash, a kill) leaves a batch that polls already answer 404 for, whose removal the
// next pass finishes. Safe to run in several processes at once.
#pragma once

#include <pqxx/pqxx>

#include <algorithm>
#include <cstdint>

#include "base/status.h"

namespace hr::queue {

struct RetentionOptions {
  int64_t partition_seconds = 86400;  // batches created in this long share a partition
  int partitions_ahead = 2;           // partitions kept ready past the current one
  // A partition closed this long ago may be dropped, so that ids made by a clock that lags stay
  // safe (-1: an interval, at most an hour).
  int64_t drop_margin_seconds = -1;
  // An expired batch's rows wait this long for their partition to be dropped, then go in chunks
  // (-1: an interval and the drop margin).
  int64_t wait_for_drop_seconds = -1;
  int rows_per_chunk = 5000;  // request rows one DELETE removes
  int max_row_chunks = 20;    // request DELETEs in one pass
  int max_batches = 500;      // batches looked at in one pass
  int max_files = 200;        // files removed in one pass
  int lock_timeout_ms = 200;  // DDL's wait for its lock

  int64_t drop_margin() const {
    return drop_margin_seconds >= 0 ? drop_margin_seconds
                                    : std::min<int64_t>(partition_seconds, 3600);
  }
  int64_t wait_for_drop() const {
    return wait_for_drop_seconds >= 0 ? wait_for_drop_seconds : partition_seconds + drop_margin();
  }
};

struct PurgeReport {
  int partitions_created = 0;
  int partitions_dropped = 0;
  int64_t requests_deleted = 0;  // rows deleted one chunk at a time (not by a partition drop)
  int batches_purged = 0;
  int files_purged = 0;
  int64_t bytes_freed = 0;  // on disk, by the partitions dropped
};

// Creates the requests partitions from the last one up to partitions_ahead intervals past now.
// Returns how many it created.
[[nodiscard]] Result<int> ensure_request_partitions(pqxx::connection& conn,
                                                    const RetentionOptions& options);

// One bounded pass of the purge: partitions, then batches, then files.
[[nodiscard]] Result<PurgeReport> purge_expired(pqxx::connection& conn,
                                                const RetentionOptions& options);

}  // namespace hr::queue
