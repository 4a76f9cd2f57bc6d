#!/usr/bin/env bash
# Fair-share benchmark: starts private Postgres and Redis, `headroom api`, `headroom dispatcher`
# and two `headroom worker`s on the bundled model, then measures (tests/bench/fairness_bench.cc):
# a small tenant's 50-request batch alone and behind another tenant's 20,000 (the slowdown, and
# the big tenant's rate before and during), two saturating tenants of weights 3 and 1 (their token
# shares over HEADROOM_FAIRNESS_SHARE_SECONDS, 60), a tight 20 s deadline behind the same
# tenant's big batch, and the estimated completion at submit against the actual for batches
# submitted into a steady backlog. Then the shared phase again with a dispatcher run with
# --fair-share=false --dispatch-by-prefix=false (first in, first out, every request pushed at
# once into the shared stream, as before the fair relay), for comparison.
# Then cache-aware dispatch (docs/cache-aware-dispatch.md): four workers on a small random model
# with a context of 2,048 (written to .headroom/bench-model-small on first use; ChatML, which
# renders system messages, as its chat template), each with a KV cache of
# HEADROOM_PREFIX_KV_BYTES (8 MiB: 1,024 blocks, room for about 29 of the prompts' starts, fewer
# than the HEADROOM_PREFIX_PROMPTS (64) in play, more than a quarter of them), run
# HEADROOM_PREFIX_REQUESTS (8,000) requests over those system prompts of ~512 bytes (~560
# tokens rendered), in turn; the cached prompt tokens against the ideal, with
# --dispatch-by-prefix and without. HEADROOM_FAIRNESS_PHASES ("fair prefix") picks the parts;
# HEADROOM_FAIRNESS_WORKER_ARGS, _DISPATCHER_ARGS and _DRIVER_ARGS go to the fair part's workers,
# dispatcher and driver (e.g. --fair-lookahead 0; --phases shared).
# The last line of output is one JSON object with the figures.
set -euo pipefail
bench_targets="headroom_fairness_bench headroom_engine_bench"
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
phases=${HEADROOM_FAIRNESS_PHASES:-fair prefix}
model="@hr/tiny-reverse"
prefix_model="@hr/bench-small"
small=$root/.headroom/bench-model-small
if [[ " $phases " == *" prefix "* && ! -f "$small/model.safetensors" ]]; then
  "$build"/tests/headroom_engine_bench --make-random-model "$small" --shape small \
    --tokenizer-from models/tiny-reverse --output-vocab printable >&2
fi
declare -A keys
for t in a b c d e; do keys[$t]=$(bench_key "tenant-$t"); done
$bin --log-level warn accounts set --account tenant-c --weight 3 >/dev/null
$bin --log-level warn accounts set --account tenant-d --weight 1 >/dev/null
$bin --log-level warn api --port "$port" --served-model "$model:128" \
  --served-model "$prefix_model:2048" &
pids+=("$!")
start_dispatcher() {
  # shellcheck disable=SC2068
  $bin --log-level warn dispatcher --no-webhooks $@ &
  dispatcher_pid=$!
  pids+=("$dispatcher_pid")
}
stop_dispatcher() {
  kill -TERM "$dispatcher_pid"
  wait "$dispatcher_pid" 2>/dev/null || true
}
driver() {
  "$build"/tests/headroom_fairness_bench --port "$port" --model "$model" \
    --database-url "$HEADROOM_DATABASE_URL" --key-a "${keys[a]}" --key-b "${keys[b]}" \
    --key-c "${keys[c]}" --key-d "${keys[d]}" --key-e "${keys[e]}" \
    --share-seconds "${HEADROOM_FAIRNESS_SHARE_SECONDS:-60}" "$@"
}
fair='{}'
fifo='{}'
if [[ " $phases " == *" fair "* ]]; then
  tiny_pids=()
  for w in 1 2; do
    # shellcheck disable=SC2086
    $bin --log-level warn worker --model models/tiny-reverse --worker-name "w$w" \
      ${HEADROOM_FAIRNESS_WORKER_ARGS:-} &
    tiny_pids+=("$!")
    pids+=("$!")
  done
  # shellcheck disable=SC2086
  start_dispatcher ${HEADROOM_FAIRNESS_DISPATCHER_ARGS:-}
  bench_wait_ready "$port"
  sleep 2  # the workers register
  # shellcheck disable=SC2086
  driver ${HEADROOM_FAIRNESS_DRIVER_ARGS:-} | tee "$svc/fair.out"
  fair=$(tail -n 1 "$svc/fair.out")
  stop_dispatcher
  # (without the workers' own streams too, which would let a newcomer's requests past the
  # shared stream's backlog)
  start_dispatcher --fair-share=false --dispatch-by-prefix=false
  driver --phases shared | tee "$svc/fifo.out"
  fifo=$(tail -n 1 "$svc/fifo.out")
  stop_dispatcher
  for p in "${tiny_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${tiny_pids[@]}"; do wait "$p" 2>/dev/null || true; done
fi
prefix_on='{}'
prefix_off='{}'
if [[ " $phases " == *" prefix "* ]]; then
  for w in 1 2 3 4; do
    $bin --log-level warn worker --model "$small" --name "$prefix_model" --worker-name "p$w" \
      --kv-cache-bytes "${HEADROOM_PREFIX_KV_BYTES:-8388608}" --chat-template chatml &
    pids+=("$!")
  done
  bench_wait_ready "$port"
  sleep 3  # the workers load and register
  prefix() {
    driver --phases prefix --prefix-model "$prefix_model" \
      --prefix-requests "${HEADROOM_PREFIX_REQUESTS:-8000}" \
      --prefixes "${HEADROOM_PREFIX_PROMPTS:-64}" --prefix-bytes 512 "$@"
  }
  start_dispatcher
  prefix --salt on | tee "$svc/prefix-on.out"
  prefix_on=$(tail -n 1 "$svc/prefix-on.out")
  stop_dispatcher
  start_dispatcher --dispatch-by-prefix=false
  prefix --salt off | tee "$svc/prefix-off.out"
  prefix_off=$(tail -n 1 "$svc/prefix-off.out")
  stop_dispatcher
fi
python3 - "$fair" "$fifo" "$prefix_on" "$prefix_off" <<'PY'
import json, sys
fair, fifo, on, off = (json.loads(a) for a in sys.argv[1:5])
if fifo:
    fair["fifo_small_tenant_slowdown"] = fifo["small_tenant_slowdown"]
    fair["fifo_small_shared_s"] = fifo["small_shared_s"]
    fair["fifo_small_alone_s"] = fifo["small_alone_s"]
if on:
    fair["prefix_dispatch"] = on
    fair["prefix_dispatch_off"] = off
    fair["prefix_cached_fraction"] = on["cached_fraction_of_ideal"]
    fair["prefix_cached_fraction_off"] = off.get("cached_fraction_of_ideal")
    fair.setdefault("goals", {})
    fair["goals"]["prefix_cached_fraction"] = ">= 0.9"
    fair["goals"]["prefix_cached_fraction_off"] = "<= 0.3"
print(json.dumps(fair))
PY
