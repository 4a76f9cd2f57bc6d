#!/usr/bin/env bash
# Flex benchmark: does queued async work fill the capacity that sync traffic leaves, without sync
# latency noticing? Starts private Postgres and Redis and, per model, one `headroom serve` (API,
# worker and dispatcher in one process, worker options at their defaults), then runs three phases
# against it: (c) async only, the capacity in generated tokens/s; (a) streamed sync requests as
# Poisson arrivals using about half of it, p50/p99 time to first token and end to end; (b) the
# same sync arrivals over an async backlog; (a) and (b) alternate in three rounds of slices, so
# that drift in the machine's speed weighs on both alike. Models: the bundled @hr/tiny-reverse and a ~100M
# random-weight Llama whose LM head only writes printable bytes (bench_engine.sh's model, written
# to .headroom/bench-model-100m-text on first use). Charts go to
# .headroom/bench-flex/<label>.png. The last line of output is one JSON object.
#
# On a GPU, model llama8b: a random-weight Llama on Llama 3 8B's shape (16 GB of bf16 written to
# .headroom/bench-model-llama3-8b-text on first use, its LM head writing printable bytes only)
# served with --device cuda; its own goals (sync p99 TTFT ratio <= 1.05, async tokens >= 0.8 of
# what sync leaves, by tokens) are in the JSON's "gpu". scripts/gpu_check.sh's flex stage runs it
# with the binaries of scripts/gpu_prepare.sh (HEADROOM_BENCH_BUILD, HEADROOM_PORTABLE).
#
# Knobs: HEADROOM_BENCH_PHASE_SECONDS (30), HEADROOM_FLEX_MODELS ("tiny model_100m"; llama8b),
# HEADROOM_FLEX_MAX_TOKENS (32), HEADROOM_FLEX_SERVE_ARGS (extra `serve` options); arguments go
# to headroom_flex_bench (e.g. --sync-fraction 0.3).
set -euo pipefail
bench_targets="headroom_flex_bench headroom_engine_bench"
# shellcheck source=scripts/bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
# The benchmark's own binaries: the build folder's (under tests/), a folder of binaries' (flat),
# else this checkout's release build.
tool() {
  local t
  for t in "$build/tests/$1" "$build/$1" "build-release/tests/$1"; do
    if [ -x "$t" ]; then
      echo "$t"
      return
    fi
  done
  echo "bench_flex: no $1 in $build or build-release/tests" >&2
  exit 1
}
# make_model DIR ARGS...: a random model written (to a side folder, moved into place when whole,
# so that a run stopped part-way leaves none half-written).
make_model() {
  local dir=$1
  shift
  if [ ! -f "$dir/model.safetensors" ]; then
    rm -rf "$dir.partial"
    "$engine_bench" --make-random-model "$dir.partial" --tokenizer-from models/tiny-reverse \
      --output-vocab printable "$@" >&2
    mv "$dir.partial" "$dir"
  fi
}
bench=$(tool headroom_flex_bench)
engine_bench=$(tool headroom_engine_bench)
phase_seconds=${HEADROOM_BENCH_PHASE_SECONDS:-30}
max_tokens=${HEADROOM_FLEX_MAX_TOKENS:-32}
out_dir=$root/.headroom/bench-flex
mkdir -p "$out_dir"
key="hr_bench_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run_model LABEL MODEL_DIR MODEL_NAME [ARGS]: one serve process (with $serve_extra), the three
# phases, serve stopped; the driver's JSON line goes to $out_dir/LABEL.json.
serve_extra=
run_model() {
  local label=$1 dir=$2 name=$3 serve_port serve_pid
  shift 3
  echo '{"error": "did not run"}' >"$out_dir/$label.json"
  serve_port=$(free_port)
  # shellcheck disable=SC2086
  HEADROOM_API_KEY=$key $bin --log-level warn serve --port "$serve_port" --model "$dir" \
    --name "$name" --no-webhooks $serve_extra ${HEADROOM_FLEX_SERVE_ARGS:-} >"$out_dir/$label-serve.log" 2>&1 &
  serve_pid=$!
  pids+=("$serve_pid")
  # Serve listens once the model is loaded; larger models take a while.
  local ready=0
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$serve_port/readyz" >/dev/null; then
      ready=1
      break
    fi
    kill -0 "$serve_pid" 2>/dev/null || break
    sleep 0.2
  done
  if [ "$ready" = 0 ]; then
    echo "serve for $label did not become ready; see $out_dir/$label-serve.log" >&2
    kill -TERM "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
    return 0
  fi
  $bench --port "$serve_port" --key "$key" --model-name "$name" --label "$label" \
    --max-tokens "$max_tokens" --phase-seconds "$phase_seconds" \
    --chart "$out_dir/$label.png" "$@" | tail -1 >"$out_dir/$label.json" || true
  kill -TERM "$serve_pid" 2>/dev/null || true
  wait "$serve_pid" 2>/dev/null || true
}

labels=()
for model in ${HEADROOM_FLEX_MODELS:-tiny model_100m}; do
  case $model in
    tiny)
      run_model tiny "$root/models/tiny-reverse" @hr/tiny-reverse "$@"
      ;;
    model_100m)
      # The engine benchmark's random model, writing only printable text (so that answers
      # stream content to time) and never ending before max_tokens.
      big=$root/.headroom/bench-model-100m-text
      make_model "$big"
      run_model model_100m "$big" @hr/bench-100m "$@"
      ;;
    llama8b)
      big=$root/.headroom/bench-model-llama3-8b-text
      make_model "$big" --shape llama3-8b
      serve_extra="--device cuda"
      run_model llama8b "$big" @hr/bench-llama3-8b "$@"
      serve_extra=
      ;;
    *)
      echo "unknown model '$model' in HEADROOM_FLEX_MODELS (tiny, model_100m, llama8b)" >&2
      exit 2
      ;;
  esac
  labels+=("$model")
done

python3 - "$out_dir" "${labels[@]}" <<'PY'
import json, sys
runs = {}
for label in sys.argv[2:]:
    with open(f"{sys.argv[1]}/{label}.json") as f:
        text = f.read().strip()
    try:
        runs[label] = json.loads(text)
    except ValueError:
        runs[label] = {"error": "unparsable output: " + text[:200]}
tiny = runs.get("tiny", {})
gpu = runs.get("llama8b")
print(json.dumps({
    "sync_p99_ttft_ratio": tiny.get("sync_p99_ttft_ratio"),
    "async_fill_ratio": tiny.get("async_fill_ratio"),
    "goals": {"sync_p99_ttft_ratio": "<= 1.10", "async_fill_ratio": ">= 0.8", "errors": "0"},
    **({"gpu": {
        "sync_p99_ttft_ratio": gpu.get("sync_p99_ttft_ratio"),
        "async_fill_ratio_by_tokens": gpu.get("async_fill_ratio_by_tokens"),
        "goals": {"sync_p99_ttft_ratio": "<= 1.05", "async_fill_ratio_by_tokens": ">= 0.8"}}}
       if gpu is not None else {}),
    "errors": sum(r.get("errors", 1) for r in runs.values()),
    **runs,
    "charts": [r["chart"] for r in runs.values() if "chart" in r]}))
sys.exit(1 if any("error" in r for r in runs.values()) else 0)
PY
