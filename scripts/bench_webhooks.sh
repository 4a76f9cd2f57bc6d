#!/usr/bin/env bash
# Webhook delivery benchmark: starts private Postgres and Redis and a real `headroom dispatcher`,
# then completes batches through the store and measures delivery to a local receiver:
# latency from completion to delivery at a steady 1,000 completions/s (10,000 events), the drain
# rate of a 10,000-event burst, and delivery while the receiver refuses connections about half of
# the time in random intervals (every event must arrive). The last line is one JSON object.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh >/dev/null
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j "${HEADROOM_JOBS:-2}" --target headroom headroom_webhook_bench >/dev/null

svc=$(mktemp -d /tmp/headroom-bench.XXXXXX)
chmod 755 "$svc"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/services.sh stop "$svc" >/dev/null 2>&1 || true
  rm -rf "$svc"
}
trap cleanup EXIT
scripts/services.sh start "$svc" >/dev/null
# shellcheck disable=SC1091
source "$svc/env"
bin=build-release/headroom
$bin --log-level warn migrate
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# Short retries so the flaky phase ends in minutes: 20 retries, 1-3 s apart (jittered).
schedule=1s,1s,1s,2s,2s,2s,3s,3s,3s,3s,3s,3s,3s,3s,3s,3s,3s,3s,3s,3s
$bin --log-level error dispatcher --webhook-allow loopback --webhook-retry-schedule "$schedule" \
  --webhook-timeout-ms 5000 "$@" &
pids+=("$!")
build-release/tests/headroom_webhook_bench --database-url "$HEADROOM_DATABASE_URL" --port "$port" \
  --events "${HEADROOM_BENCH_EVENTS:-10000}" --rate "${HEADROOM_BENCH_RATE:-1000}"
