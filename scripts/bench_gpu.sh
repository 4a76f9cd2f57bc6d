#!/usr/bin/env bash
# GPU engine benchmark: a Llama-3-8B-shaped model with random bf16 weights made on the GPU, run
# through our engine (decode tokens/s at batch 1, 16, 64, 256 after 512-token prompts; prefill
# tokens/s for 2,048-token prompts; batch-1 memory-bandwidth utilisation against a device copy
# timed in the same run; GPU memory left for the KV cache), then the same figures for Hugging Face
# transformers on the same GPU and shape (when PyTorch and transformers are importable). The last
# line of output is one JSON object; the baseline's figures are under "baseline", the best batch-1
# setting under "best_batch1_mbu" (with the --cuda-options that give it).
# HEADROOM_PREBUILT=DIR uses a headroom_gpu_bench already built in DIR instead of building;
# HEADROOM_BENCH_BASELINE=0 leaves the baseline out; HEADROOM_BENCH_BASELINE_TIMEOUT_S bounds it
# (default 240). Exits non-zero when a phase of the engine's run failed (its figures still print).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ -n "${HEADROOM_PREBUILT:-}" ]; then
  bench=$HEADROOM_PREBUILT/headroom_gpu_bench
else
  scripts/setup.sh >/dev/null
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHEADROOM_CUDA=ON >/dev/null
  cmake --build build-gpu -j "${HEADROOM_JOBS:-$(nproc)}" --target headroom_gpu_bench >/dev/null
  bench=build-gpu/tests/headroom_gpu_bench
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The engine prints its figures so far as a JSON line after each phase; a failed phase is recorded
# in them ("errors") and the run goes on, so its last JSON line is reported in any case.
rc=0
"$bench" "$@" | tee "$log" >&2 || rc=$?
ours=$(grep '^{' "$log" | tail -1 || true)
if [ -z "$ours" ]; then
  echo "bench_gpu: the engine benchmark printed no figures (exit $rc)" >&2
  exit 1
fi
baseline=null
if [ "${HEADROOM_BENCH_BASELINE:-1}" = 0 ]; then
  echo "bench_gpu: baseline skipped (HEADROOM_BENCH_BASELINE=0)" >&2
elif python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
  # A failed or overlong baseline loses only the baseline: our figures are reported all the same.
  if PYTHONUNBUFFERED=1 timeout --kill-after=10 "${HEADROOM_BENCH_BASELINE_TIMEOUT_S:-240}" \
      python3 scripts/bench_gpu_baseline.py 2>&1 | tee "$log" >&2 &&
    python3 -c 'import json, sys; json.loads(sys.argv[1])' "$(grep '^{' "$log" | tail -1)" 2>/dev/null; then
    baseline=$(grep '^{' "$log" | tail -1)
  else
    echo "bench_gpu: the baseline failed or ran out of time (above); reported as null" >&2
  fi
else
  echo "bench_gpu: no PyTorch with CUDA and transformers here; baseline skipped" >&2
fi
python3 - "$ours" "$baseline" <<'PY'
import json, sys
ours, base = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = dict(ours)
out["goals"] = {"batch1_mbu": ">= 0.85"}
out["baseline"] = base
decode = ours.get("decode_tok_s", {})
plain = ours.get("decode_tok_s_not_pipelined", {})
out["pipelining_gain"] = {b: round(decode[b] / plain[b], 3) for b in decode if plain.get(b)}
if base:
    out["speedup_vs_baseline"] = {
        "decode": {b: round(decode[b] / base["decode_tok_s"][b], 2)
                   for b in decode if base.get("decode_tok_s", {}).get(b)},
        "prefill": round(ours["prefill_tok_s"] / base["prefill_tok_s"], 2)
                   if ours.get("prefill_tok_s") and base.get("prefill_tok_s") else None,
    }
print(json.dumps(out))
PY
exit "$rc"
