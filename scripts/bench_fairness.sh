#!/usr/bin/env bash
# Fair-share benchmark: starts private Postgres and Redis, `headroom api`, `headroom dispatcher`
# and two `headroom worker`s on the bundled model, then measures (tests/bench/fairness_bench.cc):
# a small tenant's 50-request batch alone and behind another tenant's 20,000 (the slowdown, and
# the big tenant's rate before and during), two saturating tenants of weights 3 and 1 (their token
# shares over HEADROOM_FAIRNESS_SHARE_SECONDS, 60), a tight 20 s deadline behind the same
# tenant's big batch, and the estimated completion at submit against the actual for batches
# submitted into a steady backlog. Then the shared phase again with a dispatcher run with
# --fair-share=false (first in, first out, every request pushed at once, as before the fair
# relay), for comparison. The last line of output is one JSON object with the figures.
set -euo pipefail
bench_targets="headroom_fairness_bench"
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
model="@hr/tiny-reverse"
declare -A keys
for t in a b c d e; do keys[$t]=$(bench_key "tenant-$t"); done
$bin --log-level warn accounts set --account tenant-c --weight 3 >/dev/null
$bin --log-level warn accounts set --account tenant-d --weight 1 >/dev/null
$bin --log-level warn api --port "$port" &
pids+=("$!")
for w in 1 2; do
  $bin --log-level warn worker --model models/tiny-reverse --worker-name "w$w" &
  pids+=("$!")
done
start_dispatcher() {
  # shellcheck disable=SC2068
  $bin --log-level warn dispatcher --no-webhooks $@ &
  dispatcher_pid=$!
  pids+=("$dispatcher_pid")
}
# shellcheck disable=SC2086
start_dispatcher ${HEADROOM_FAIRNESS_DISPATCHER_ARGS:-}
bench_wait_ready "$port"
sleep 2  # the workers register
driver() {
  build-release/tests/headroom_fairness_bench --port "$port" --model "$model" \
    --database-url "$HEADROOM_DATABASE_URL" --key-a "${keys[a]}" --key-b "${keys[b]}" \
    --key-c "${keys[c]}" --key-d "${keys[d]}" --key-e "${keys[e]}" \
    --share-seconds "${HEADROOM_FAIRNESS_SHARE_SECONDS:-60}" "$@"
}
# shellcheck disable=SC2086
driver ${HEADROOM_FAIRNESS_DRIVER_ARGS:-} | tee "$svc/fair.out"
fair=$(tail -n 1 "$svc/fair.out")
kill -TERM "$dispatcher_pid"
wait "$dispatcher_pid" 2>/dev/null || true
start_dispatcher --fair-share=false
driver --phases shared | tee "$svc/fifo.out"
fifo=$(tail -n 1 "$svc/fifo.out")
python3 - "$fair" "$fifo" <<'PY'
import json, sys
fair, fifo = json.loads(sys.argv[1]), json.loads(sys.argv[2])
fair["fifo_small_tenant_slowdown"] = fifo["small_tenant_slowdown"]
fair["fifo_small_shared_s"] = fifo["small_shared_s"]
fair["fifo_small_alone_s"] = fifo["small_alone_s"]
print(json.dumps(fair))
PY
