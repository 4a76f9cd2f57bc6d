#!/usr/bin/env bash
# OpenAI Batch API benchmark: starts private Postgres and Redis and `headroom api` (no worker, no
# dispatcher: the driver relays, completes with a no-work consumer and finalizes in-process, so
# each phase is timed alone), then measures upload and download of a ~100 MB input file, batch
# creation (every line validated and stored) for 100,000 and 10,000 requests, finalizing a finished
# 10,000-request batch into its output file, and reading it back. Goals: finalizing 10,000 well
# under a second. The last line of output is one JSON object with the figures.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh >/dev/null
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j "${HEADROOM_JOBS:-2}" --target headroom headroom_openai_bench >/dev/null

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
pids+=("$!")
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
  sleep 0.1
done
build-release/tests/headroom_openai_bench --port "$port" --key "$key" --model "$model" \
  --database-url "$HEADROOM_DATABASE_URL" --redis-url "$HEADROOM_REDIS_URL"
