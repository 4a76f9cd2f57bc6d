#!/usr/bin/env bash
# OpenAI Batch API benchmark: starts private Postgres and Redis and `headroom api` (no worker, no
# dispatcher: the driver relays, completes with a no-work consumer and finalizes in-process, so
# each phase is timed alone), then measures upload and download of a ~100 MB input file, batch
# creation (every line validated and stored) for 100,000 and 10,000 requests, finalizing a finished
# 10,000-request batch into its output file, and reading it back. Goals: finalizing 10,000 well
# under a second. The last line of output is one JSON object with the figures.
set -euo pipefail
bench_targets="headroom_openai_bench"
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
key=$(bench_key bench)
model="@hr/tiny-reverse"
$bin --log-level warn api --port "$port" &
pids+=("$!")
bench_wait_ready "$port"
"$build"/tests/headroom_openai_bench --port "$port" --key "$key" --model "$model" \
  --database-url "$HEADROOM_DATABASE_URL" --redis-url "$HEADROOM_REDIS_URL"
