#!/usr/bin/env bash
# Retention soak: starts private Postgres and Redis, `headroom api` with a retention of minutes and
# `headroom dispatcher` with one-minute partitions, then submits and completes batches without
# pause for SOAK_SECONDS (1200) and samples the database's size every 10 s. It passes when the size
# levels off within 20% of its value after the first retention window (instead of growing with the
# service's age), throughput late matches throughput early, and every poll of a batch that has not
# expired answers. The last line of output is one JSON object with the figures.
set -euo pipefail
bench_targets="headroom_soak_retention"
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
seconds=${SOAK_SECONDS:-1200}
retention_s=${SOAK_RETENTION_S:-180}
partition_s=${SOAK_PARTITION_S:-60}
key=$(bench_key soak)
model="@hr/tiny-reverse"
days=$(python3 -c "print($retention_s / 86400)")
$bin --log-level warn api --port "$port" --retention-days "$days" &
pids+=("$!")
$bin --log-level warn dispatcher --partition-interval-s "$partition_s" --purge-interval-ms 2000 &
pids+=("$!")
bench_wait_ready "$port"
build-release/tests/headroom_soak_retention --port "$port" --key "$key" --model "$model" \
  --database-url "$HEADROOM_DATABASE_URL" --redis-url "$HEADROOM_REDIS_URL" \
  --seconds "$seconds" --retention-s "$retention_s" --partition-s "$partition_s" \
  | tee "$svc/soak.jsonl"
tail -1 "$svc/soak.jsonl" | python3 -c '
import json, sys
r = json.load(sys.stdin)
ok = r.get("levels_off") and r["polls_of_unexpired_lost"] == 0 and r["throughput_late_to_early"] >= 0.8
sys.exit(0 if ok else 1)'
