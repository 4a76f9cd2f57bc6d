#!/usr/bin/env bash
# Webhook delivery benchmark: starts private Postgres and Redis and a real `headroom dispatcher`,
# then completes batches through the store and measures delivery to a local receiver:
# latency from completion to delivery at a steady 1,000 completions/s (10,000 events), the drain
# rate of a 10,000-event burst, and delivery while the receiver refuses connections about half of
# the time in random intervals (every event must arrive). The last line is one JSON object.
set -euo pipefail
bench_targets="headroom_webhook_bench"
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
# Short retries so the flaky phase ends in minutes: 20 retries, 1-3 s apart (jittered).
schedule=1s,1s,1s,2s,2s,2s,3s,3s,3s,3s,3s,3s,3s,3s,3s,3s,3s,3s,3s,3s
$bin --log-level error dispatcher --webhook-allow loopback --webhook-retry-schedule "$schedule" \
  --webhook-timeout-ms 5000 "$@" &
pids+=("$!")
"$build"/tests/headroom_webhook_bench --database-url "$HEADROOM_DATABASE_URL" --port "$port" \
  --events "${HEADROOM_BENCH_EVENTS:-10000}" --rate "${HEADROOM_BENCH_RATE:-1000}"
