// The purge and the requests partitions.
#include "queue/retention.h"

#include <string>
#include <vector>

#include "base/log.h"
#include "queue/pg.h"

namespace hr::queue {

namespace {

// One partition creator at a time (pg_advisory_xact_lock key).
constexpr int64_t kPartitionLock = 0x68725f7061727473;  // "hr_parts"

// A batch is gone once deleted, or ended with its expiry passed (queue/internal/batch_row.h).
constexpr const char* kGone =
    "(deleted_at IS NOT NULL OR (finished_at IS NOT NULL AND expires_at <= now()))";

void set_lock_timeout(pqxx::work& tx, const RetentionOptions& o) {
  tx.exec("SET LOCAL lock_timeout = '" + std::to_string(o.lock_timeout_ms) + "ms'");
}

Result<int> drop_dead_partitions(pqxx::connection& conn, const RetentionOptions& o,
                                 PurgeReport* report) {
  std::vector<std::string> closed;
  HR_RETURN_IF_ERROR(pg_guard("list partitions", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    for (const auto& row :
         tx.exec_params("SELECT name FROM request_partitions "
                        "WHERE hi_at < now() - $1 * interval '1 second' ORDER BY hi_at LIMIT 8",
                        o.drop_margin())) {
      closed.push_back(row[0].as<std::string>());
    }
    return Status::ok();
  }));
  int dropped = 0;
  for (const std::string& name : closed) {
    Status st = pg_guard("drop partition", [&]() -> Status {
      pqxx::work tx(conn);
      set_lock_timeout(tx, o);
      // Locks the registry row: two purges never drop the same partition.
      pqxx::result reg = tx.exec_params(
          "SELECT CASE WHEN lo_at = '-infinity' THEN '' ELSE hr_uuid_v7_floor(lo_at)::text END, "
          "hr_uuid_v7_floor(hi_at)::text "
          "FROM request_partitions WHERE name = $1 FOR UPDATE SKIP LOCKED",
          name);
      if (reg.empty()) return Status::ok();
      std::string lo = reg[0][0].as<std::string>();
      std::string hi = reg[0][1].as<std::string>();
      // Nothing becomes live again once gone, and no batch is created in a closed interval.
      pqxx::row live = tx.exec_params1(
          std::string("SELECT EXISTS (SELECT 1 FROM batches WHERE ($1 = '' OR id >= $1::uuid) "
                      "AND id < $2::uuid AND NOT ") +
              kGone + ")",
          lo, hi);
      if (live[0].as<bool>()) return Status::ok();
      pqxx::row size = tx.exec_params1("SELECT pg_total_relation_size($1::regclass)", name);
      tx.exec("DROP TABLE " + tx.quote_name(name));
      tx.exec_params("DELETE FROM request_partitions WHERE name = $1", name);
      tx.commit();
      report->bytes_freed += size[0].as<int64_t>();
      ++dropped;
      log::info("retention.partition_dropped",
                {{"partition", name}, {"bytes", size[0].as<int64_t>()}});
      return Status::ok();
    });
    if (st.code() == StatusCode::kUnavailable) return st;
    if (!st.is_ok()) log::warn("retention.drop_failed", {{"partition", name}, {"error", st}});
  }
  return dropped;
}

struct GoneBatch {
  std::string id;
  bool rows_may_go;  // deleted by the client, or expired long enough ago
};

Status purge_batches(pqxx::connection& conn, const RetentionOptions& o, PurgeReport* report) {
  const int64_t wait = o.wait_for_drop();
  std::vector<GoneBatch> gone;
  HR_RETURN_IF_ERROR(pg_guard("list gone batches", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    for (const auto& row : tx.exec_params(
             "(SELECT id::text, true FROM batches WHERE deleted_at IS NOT NULL ORDER BY id "
             "LIMIT $1) UNION ALL "
             "(SELECT id::text, expires_at <= now() - $2 * interval '1 second' FROM batches "
             "WHERE finished_at IS NOT NULL AND expires_at <= now() AND deleted_at IS NULL "
             "ORDER BY expires_at LIMIT $1)",
             o.max_batches, wait)) {
      gone.push_back({row[0].as<std::string>(), row[1].as<bool>()});
    }
    return Status::ok();
  }));
  int chunks = 0;
  for (const GoneBatch& b : gone) {
    bool has_rows = false;
    HR_RETURN_IF_ERROR(pg_guard("purge requests", [&]() -> Status {
      pqxx::nontransaction tx(conn);
      has_rows = tx.exec_params1("SELECT EXISTS (SELECT 1 FROM requests WHERE batch_id = $1::uuid)",
                                 b.id)[0]
                     .as<bool>();
      // Each chunk commits alone: no lock is held long, and a stop keeps what went.
      while (has_rows && b.rows_may_go && chunks < o.max_row_chunks) {
        ++chunks;
        pqxx::result del = tx.exec_params(
            "DELETE FROM requests WHERE batch_id = $1::uuid AND idx < "
            "(SELECT min(idx) FROM requests WHERE batch_id = $1::uuid) + $2",
            b.id, o.rows_per_chunk);
        report->requests_deleted += static_cast<int64_t>(del.affected_rows());
        has_rows = static_cast<int>(del.affected_rows()) > 0 &&
                   tx.exec_params1(
                         "SELECT EXISTS (SELECT 1 FROM requests WHERE batch_id = "
                         "$1::uuid)",
                         b.id)[0]
                       .as<bool>();
      }
      return Status::ok();
    }));
    if (has_rows) continue;  // waits for its partition, or for the next pass
    HR_RETURN_IF_ERROR(pg_guard("purge batch", [&]() -> Status {
      pqxx::work tx(conn);
      pqxx::result locked = tx.exec_params(
          std::string("SELECT output_file_id, error_file_id FROM batches WHERE id = $1::uuid "
                      "AND ") +
              kGone + " FOR UPDATE SKIP LOCKED",
          b.id);
      if (locked.empty()) return Status::ok();
      tx.exec_params("DELETE FROM outbox WHERE batch_id = $1::uuid", b.id);
      tx.exec_params("DELETE FROM webhook_deliveries WHERE batch_id = $1::uuid", b.id);
      tx.exec_params(
          "DELETE FROM files WHERE id IN ($1::uuid, $2::uuid)",
          locked[0][0].is_null() ? std::nullopt : std::optional<std::string>(locked[0][0].c_str()),
          locked[0][1].is_null() ? std::nullopt : std::optional<std::string>(locked[0][1].c_str()));
      tx.exec_params("DELETE FROM batches WHERE id = $1::uuid", b.id);
      tx.commit();
      ++report->batches_purged;
      return Status::ok();
    }));
  }
  return Status::ok();
}

Status purge_files(pqxx::connection& conn, const RetentionOptions& o, PurgeReport* report) {
  std::vector<std::string> ids;
  HR_RETURN_IF_ERROR(pg_guard("list gone files", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    for (const auto& row : tx.exec_params(
             "(SELECT id::text FROM files WHERE deleted_at IS NOT NULL LIMIT $1) UNION "
             "(SELECT id::text FROM files WHERE expires_at <= now() ORDER BY expires_at LIMIT $1)",
             o.max_files)) {
      ids.push_back(row[0].as<std::string>());
    }
    return Status::ok();
  }));
  for (const std::string& id : ids) {  // one file (up to its size in chunks) a transaction
    HR_RETURN_IF_ERROR(pg_guard("purge file", [&]() -> Status {
      pqxx::nontransaction tx(conn);
      report->files_purged += static_cast<int>(
          tx.exec_params("DELETE FROM files WHERE id = $1::uuid", id).affected_rows());
      return Status::ok();
    }));
  }
  return Status::ok();
}

}  // namespace

Result<int> ensure_request_partitions(pqxx::connection& conn, const RetentionOptions& o) {
  if (o.partition_seconds < 60) {
    return invalid_argument("the partition interval must be at least a minute",
                            "partition-interval");
  }
  int created = 0;
  Status st = pg_guard("create partitions", [&]() -> Status {
    pqxx::work tx(conn);
    set_lock_timeout(tx, o);
    tx.exec_params("SELECT pg_advisory_xact_lock($1)", kPartitionLock);
    for (int guard = 0; guard < 64; ++guard) {
      // The next interval: from the last partition's end to the next multiple of the interval
      // (since the epoch), or, after a long gap, up to the current interval's start.
      pqxx::row next = tx.exec_params1(
          "SELECT m.hi < now() + $2 * $1 * interval '1 second', "
          "  'requests_p' || to_char(m.hi AT TIME ZONE 'UTC', 'YYYYMMDD\"_\"HH24MISS'), "
          "  m.hi, n.hi, hr_uuid_v7_floor(m.hi)::text, hr_uuid_v7_floor(n.hi)::text "
          "FROM (SELECT max(hi_at) AS hi FROM request_partitions) AS m, LATERAL (SELECT CASE "
          "  WHEN to_timestamp(floor(extract(epoch FROM now()) / $1) * $1) > m.hi "
          "    + $1 * interval '1 second' "
          "  THEN to_timestamp(floor(extract(epoch FROM now()) / $1) * $1) "
          "  ELSE to_timestamp((floor(extract(epoch FROM m.hi) / $1) + 1) * $1) END AS hi) AS n",
          o.partition_seconds, o.partitions_ahead + 1);
      if (!next[0].as<bool>()) break;
      std::string name = next[1].as<std::string>();
      std::string q = tx.quote_name(name);
      std::string lo_id = next[4].as<std::string>();
      std::string hi_id = next[5].as<std::string>();
      tx.exec("CREATE TABLE " + q +
              " (LIKE requests INCLUDING DEFAULTS INCLUDING CONSTRAINTS) WITH (fillfactor = 80)");
      // Rows the default partition caught for this interval move in before it is attached. A
      // reader whose plan listed the partitions before the attach, and whose rows it read after
      // the move, would find them in neither: while rows move, the table is locked against
      // readers (they wait, then plan again over the new partition). With none to move (the
      // partitions made ahead, as usual) nothing waits.
      const bool caught = tx.exec_params1(
                                "SELECT EXISTS (SELECT 1 FROM requests_default WHERE batch_id >= "
                                "$1::uuid AND batch_id < $2::uuid)",
                                lo_id, hi_id)[0]
                              .as<bool>();
      if (caught) tx.exec("LOCK TABLE requests IN ACCESS EXCLUSIVE MODE");
      tx.exec_params(
          "WITH moved AS (DELETE FROM requests_default WHERE batch_id >= $1::uuid AND "
          "batch_id < $2::uuid RETURNING *) INSERT INTO " +
              q + " SELECT * FROM moved",
          lo_id, hi_id);
      tx.exec("ALTER TABLE requests ATTACH PARTITION " + q + " FOR VALUES FROM (" +
              tx.quote(lo_id) + ") TO (" + tx.quote(hi_id) + ")");
      tx.exec_params("INSERT INTO request_partitions (name, lo_at, hi_at) VALUES ($1, $2, $3)",
                     name, next[2].as<std::string>(), next[3].as<std::string>());
      ++created;
    }
    tx.commit();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return created;
}

Result<PurgeReport> purge_expired(pqxx::connection& conn, const RetentionOptions& o) {
  PurgeReport report;
  HR_ASSIGN_OR_RETURN(report.partitions_dropped, drop_dead_partitions(conn, o, &report));
  HR_RETURN_IF_ERROR(purge_batches(conn, o, &report));
  HR_RETURN_IF_ERROR(purge_files(conn, o, &report));
  return report;
}

}  // namespace hr::queue
