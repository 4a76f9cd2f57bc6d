#!/usr/bin/env bash
# The requests table's partitioning migration (migrations/0007) on a database holding
# HEADROOM_BENCH_ROWS (1,000,000) request rows: how long it takes, that a migration killed (-9)
# part-way leaves the table as it was and runs again to the end, and that not a row is lost or
# changed. The last line of output is one JSON object with the figures. The queue benchmark before
# and after partitioning is bench_queue.sh with HEADROOM_BENCH_MIGRATIONS set to the earlier
# migrations (see docs/scaling.md).
set -euo pipefail
bench_targets=""
rows=${HEADROOM_BENCH_ROWS:-1000000}
before=$(mktemp -d /tmp/headroom-mig.XXXXXX)
cp migrations/000[1-6]_*.sql "$before/"
export HEADROOM_BENCH_MIGRATIONS=$before
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
trap 'bench_cleanup; rm -rf "$before"' EXIT
psql -q -v ON_ERROR_STOP=1 "$HEADROOM_DATABASE_URL" <<SQL
INSERT INTO accounts (id, name) VALUES (gen_random_uuid(), 'bench');
-- 100 batches of rows/100 ended requests each, created over the last 30 days (UUIDv7 ids).
INSERT INTO batches (id, account_id, model, api_shape, status, num_total, num_completed,
                     created_at, finished_at, retain_seconds, expires_at)
SELECT (lpad(to_hex((extract(epoch FROM now() - (b * interval '7 hours')) * 1000)::bigint), 12,
             '0') || '7000800000' || lpad(to_hex(b), 10, '0'))::uuid,
       a.id, '@hr/tiny-reverse', 'workers_ai', 'completed', $rows / 100, $rows / 100,
       now() - (b * interval '7 hours'), now() - (b * interval '7 hours'), 30 * 86400,
       now() - (b * interval '7 hours') + interval '30 days'
FROM generate_series(1, 100) b, accounts a;
INSERT INTO requests (batch_id, idx, body, status, result, prompt_tokens, completion_tokens,
                      started_at, finished_at)
SELECT b.id, g, '{"messages":[{"role":"user","content":"reverse: item ' || g || '"}],"max_tokens":40}',
       'completed', '{"response":"' || g || ' meti","usage":{"prompt_tokens":7}}', 7, 3, now(), now()
FROM batches b, generate_series(0, $rows / 100 - 1) g;
SQL
sum_sql="SELECT count(*) || ':' || sum(hashtext(batch_id::text || idx || body || coalesce(result, ''))) FROM requests"
before_sum=$(psql -tA "$HEADROOM_DATABASE_URL" -c "$sum_sql")
table_mb=$(psql -tA "$HEADROOM_DATABASE_URL" -c "SELECT pg_total_relation_size('requests') / 1048576")
# A copy of the database for the kill test.
copy_url="${HEADROOM_DATABASE_URL%/*}/killtest"
psql -q "$HEADROOM_DATABASE_URL" -c "CHECKPOINT"
psql -q "${HEADROOM_DATABASE_URL%/*}/postgres" -c \
  "CREATE DATABASE killtest TEMPLATE $(basename "${HEADROOM_DATABASE_URL%%\?*}")"
start=$(date +%s.%N)
$bin --log-level warn migrate
seconds=$(python3 -c "import time; print(round(time.time() - $start, 3))")
after_sum=$(psql -tA "$HEADROOM_DATABASE_URL" -c "$sum_sql")
partitions=$(psql -tA "$HEADROOM_DATABASE_URL" -c \
  "SELECT count(*) FROM pg_inherits WHERE inhparent = 'requests'::regclass")
# On the copy: kill the migration part-way. A session reading the requests table holds the
# migration inside its transaction (at the rename, after it has created its functions and table);
# the migration's client is killed (-9) and its session ends, as when its machine goes down.
psql -q "$copy_url" -c "BEGIN; LOCK TABLE requests IN ACCESS SHARE MODE; SELECT pg_sleep(60)" \
  >/dev/null 2>&1 &
locker=$!
sleep 0.5
$bin --log-level warn migrate --database-url "$copy_url" &
mpid=$!
killed=false
for _ in $(seq 1 100); do
  waiting=$(psql -tA "$copy_url" -c "SELECT count(*) FROM pg_stat_activity WHERE datname = \
    'killtest' AND wait_event_type = 'Lock'")
  if [ "$waiting" = 1 ]; then
    kill -9 "$mpid" && killed=true
    psql -tA "$copy_url" -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE \
      datname = 'killtest' AND wait_event_type = 'Lock'" \
      >/dev/null
    break
  fi
  sleep 0.1
done
wait "$mpid" 2>/dev/null || true
kill "$locker" 2>/dev/null || true
psql -tA "$copy_url" -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE \
  datname = 'killtest' AND pid <> pg_backend_pid()" >/dev/null
wait "$locker" 2>/dev/null || true
partitioned_after_kill=$(psql -tA "$copy_url" -c \
  "SELECT count(*) FROM pg_partitioned_table WHERE partrelid = 'requests'::regclass")
leftovers=$(psql -tA "$copy_url" -c "SELECT count(*) FROM pg_class WHERE relname IN \
  ('request_partitions', 'requests_legacy', 'requests_default')")
after_kill_sum=$(psql -tA "$copy_url" -c "$sum_sql")
$bin --log-level warn migrate --database-url "$copy_url"
rerun_sum=$(psql -tA "$copy_url" -c "$sum_sql")
python3 - "$rows" "$table_mb" "$killed" "$partitioned_after_kill" "$before_sum" "$after_kill_sum" \
  "$after_sum" "$seconds" "$partitions" "$rerun_sum" "$leftovers" <<'PY'
import json, sys
(rows, mb, killed, part_after_kill, before, after_kill, after, seconds, parts, rerun,
 leftovers) = sys.argv[1:]
killed_midway = killed == "true" and part_after_kill == "0" and leftovers == "0"
print(json.dumps({
    "rows": int(rows), "requests_table_mb": int(mb), "migration_seconds": float(seconds),
    "killed_mid_migration": killed_midway,
    "after_kill_unchanged": after_kill == before,
    "rows_identical_after": after == before, "rows_identical_after_rerun": rerun == before,
    "partitions_after": int(parts)}))
ok = after == before and after_kill == before and rerun == before and killed_midway
sys.exit(0 if ok else 1)
PY
