#!/usr/bin/env bash
# Queue benchmark: starts private Postgres and Redis, `headroom api` and `headroom dispatcher`, then
# measures (a) durable intake of a 10,000- and a 100,000-request batch and the API's peak RSS,
# (c) poll latency with 100 concurrent pollers, (b) pull+complete throughput with no-work
# consumers. The last line of output is one JSON object with the figures.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh >/dev/null
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j "${HEADROOM_JOBS:-2}" --target headroom headroom_queue_bench >/dev/null

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
key=$($bin keys create --account bench 2>/dev/null)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
model="@hr/tiny-reverse"
$bin --log-level warn api --port "$port" &
api_pid=$!
pids+=("$api_pid")
$bin --log-level warn dispatcher &
pids+=("$!")
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
  sleep 0.1
done
build-release/tests/headroom_queue_bench --port "$port" --key "$key" --model "$model" \
  --database-url "$HEADROOM_DATABASE_URL" --redis-url "$HEADROOM_REDIS_URL" --api-pid "$api_pid"
