#!/usr/bin/env bash
# Queue benchmark: starts private Postgres and Redis, `headroom api` and `headroom dispatcher`, then
# measures (a) durable intake of a 10,000- and a 100,000-request batch and the API's peak RSS,
# (c) poll latency with 100 concurrent pollers, (b) pull+complete throughput with no-work
# consumers. The last line of output is one JSON object with the figures.
set -euo pipefail
bench_targets="headroom_queue_bench"
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
key=$(bench_key bench)
model="@hr/tiny-reverse"
$bin --log-level warn api --port "$port" &
api_pid=$!
pids+=("$api_pid")
# shellcheck disable=SC2086
$bin --log-level warn dispatcher ${HEADROOM_BENCH_DISPATCHER_ARGS:-} &
pids+=("$!")
bench_wait_ready "$port"
"$build"/tests/headroom_queue_bench --port "$port" --key "$key" --model "$model" \
  --database-url "$HEADROOM_DATABASE_URL" --redis-url "$HEADROOM_REDIS_URL" --api-pid "$api_pid"
