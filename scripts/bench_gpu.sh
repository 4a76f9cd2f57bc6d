#!/usr/bin/env bash
# GPU engine benchmark: a Llama-3-8B-shaped model with random bf16 weights made on the GPU, run
# through our engine (decode tokens/s at batch 1, 16, 64, 256 after 512-token prompts; prefill
# tokens/s for 2,048-token prompts; batch-1 memory-bandwidth utilisation against a device copy
# timed in the same run; GPU memory left for the KV cache), then the same figures for Hugging Face
# transformers on the same GPU and shape (when PyTorch and transformers are importable). The last
# line of output is one JSON object; the baseline's figures are under "baseline", the best batch-1
# setting under "best_batch1_mbu" (with the --cuda-options that give it).
# Then the MoE section, under "moe": the Qwen3-30B-A3B shape (HEADROOM_BENCH_MOE names another,
# mixtral-8x7b where it fits; empty leaves the section out): our decode tokens/s at batch 1, 16,
# 64, 256, prefill tokens/s, batch-1 bandwidth utilisation over the bytes a token reads (its top-k
# experts, not all), and transformers on the same GPU and shape, eager and compiled (a static
# cache with torch.compile and CUDA graphs), under baseline_eager and baseline_compiled.
# The dense model's baseline too runs eager (under "baseline") and compiled ("baseline_compiled",
# batch 1 and 64).
# HEADROOM_PREBUILT=DIR uses a headroom_gpu_bench already built in DIR instead of building;
# HEADROOM_BENCH_BASELINE=0 leaves the baselines out, or names those to run (a comma list of
# dense, dense_compiled, moe_eager, moe_compiled); HEADROOM_BENCH_BASELINE_TIMEOUT_S bounds
# each (default 240), HEADROOM_BENCH_COMPILED_TIMEOUT_S each compiled one (default 150: compiling
# the 48-layer MoE with transformers' own experts loop took longer than 100 s on an H200; it now
# compiles the batched_mm experts backend, at batch 1; a baseline out of time is reported as null);
# HEADROOM_BENCH_COMPILED=0 leaves the compiled ones out.
# Then, on a GPU of at least 120 GiB (an H200), the Mixtral-8x7B shape's decode at batch 1 and 16
# (its 93 GB of bf16 weights do not fit an H100), under "moe_mixtral" (goal at batch 1: >= 140
# tok/s); HEADROOM_BENCH_MIXTRAL=0 leaves it out.
# HEADROOM_BENCH_DENSE=0 leaves the dense model out. Exits non-zero when a
# phase of the engine's run failed (its figures still print).
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
have_baseline() {
  [ "${HEADROOM_BENCH_BASELINE:-1}" != 0 ] &&
    python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null
}
# baseline NAME ARGS...: the baseline's last JSON line, or null (a failed or overlong baseline loses
# only the baseline: our figures are reported all the same).
baseline() {
  local name=$1 limit=${HEADROOM_BENCH_BASELINE_TIMEOUT_S:-240}
  shift
  local wanted=${HEADROOM_BENCH_BASELINE:-1}
  if [ "$wanted" != 0 ] && [ "$wanted" != 1 ] && [[ ",$wanted," != *",$name,"* ]]; then
    echo "bench_gpu: baseline $name skipped (HEADROOM_BENCH_BASELINE=$wanted)" >&2
    echo null
    return
  fi
  if [[ " $* " == *" --compile "* ]]; then
    limit=${HEADROOM_BENCH_COMPILED_TIMEOUT_S:-150}
    if [ "${HEADROOM_BENCH_COMPILED:-1}" = 0 ]; then
      echo "bench_gpu: compiled baseline skipped (HEADROOM_BENCH_COMPILED=0)" >&2
      echo null
      return
    fi
  fi
  if ! have_baseline; then
    echo "bench_gpu: baseline skipped (HEADROOM_BENCH_BASELINE=0, or no PyTorch with CUDA and transformers)" >&2
    echo null
    return
  fi
  PYTHONUNBUFFERED=1 timeout --kill-after=10 "$limit" \
    python3 scripts/bench_gpu_baseline.py "$@" 2>&1 | tee "$log" >&2 || true
  local last
  last=$(grep '^{' "$log" | tail -1 || true)
  if python3 -c 'import json, sys; json.loads(sys.argv[1])' "$last" 2>/dev/null; then
    echo "$last"
  else
    echo "bench_gpu: the baseline $* failed or ran out of time (above); reported as null" >&2
    echo null
  fi
}
# The engine prints its figures so far as a JSON line after each phase; a failed phase is recorded
# in them ("errors") and the run goes on, so its last JSON line is reported in any case.
rc=0
ours=null
base=null
base_compiled=null
if [ "${HEADROOM_BENCH_DENSE:-1}" != 0 ]; then
  "$bench" "$@" | tee "$log" >&2 || rc=$?
  ours=$(grep '^{' "$log" | tail -1 || true)
  if [ -z "$ours" ]; then
    echo "bench_gpu: the engine benchmark printed no figures (exit $rc)" >&2
    exit 1
  fi
  base=$(baseline dense)
  base_compiled=$(baseline dense_compiled --compile --batches 1,64 --steps 16 --prefill-batch 1)
fi
moe=null
moe_eager=null
moe_compiled=null
moe_model=${HEADROOM_BENCH_MOE-qwen3-30b-a3b}
if [ -n "$moe_model" ]; then
  "$bench" --moe "$moe_model" --max-seqs 256 | tee "$log" >&2 || rc=$?
  moe=$(grep '^{' "$log" | tail -1 || true)
  [ -n "$moe" ] || moe='{"moe": null}'
  if [ "$moe_model" = qwen3-30b-a3b ]; then
    moe_eager=$(baseline moe_eager --moe "$moe_model" --batches 1,16,64 --steps 8)
    # (batched_mm copies each token's k experts' weights: batch 1 only, where it is the fastest.)
    moe_compiled=$(baseline moe_compiled --moe "$moe_model" --compile --experts batched_mm --batches 1 --steps 16)
  fi
fi
mixtral=null
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 || true)
if [ "${HEADROOM_BENCH_MIXTRAL:-1}" != 0 ]; then
  if [ "${gpu_mib:-0}" -ge $((120 * 1024)) ] 2>/dev/null; then
    "$bench" --moe mixtral-8x7b --batches 1,16 --max-seqs 16 --moe-decode-only 1 \
      --kv-cache-mb 8192 | tee "$log" >&2 || rc=$?
    mixtral=$(grep '^{' "$log" | tail -1 || true)
    [ -n "$mixtral" ] || mixtral='{"moe": null}'
  else
    echo "bench_gpu: the Mixtral-8x7B shape left out (${gpu_mib:-?} MiB of GPU memory; its weights are 93 GB)" >&2
  fi
fi
python3 - "$ours" "$base" "$moe" "$moe_eager" "$moe_compiled" "$base_compiled" "$mixtral" <<'PY'
import json, sys
ours, base, moe, moe_eager, moe_compiled, base_compiled, mixtral = (
    json.loads(a) for a in sys.argv[1:8])
out = dict(ours or {})
if ours:
    out["goals"] = {"batch1_mbu": ">= 0.85"}
    out["baseline"] = base
    out["baseline_compiled"] = base_compiled
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
    if base_compiled:
        out["speedup_vs_compiled_baseline"] = {
            b: round(decode[b] / base_compiled["decode_tok_s"][b], 2)
            for b in decode if base_compiled.get("decode_tok_s", {}).get(b)}
if moe and moe.get("moe"):
    m = dict(moe["moe"])
    m["goals"] = {"batch1_active_mbu": ">= 0.85"}
    m["baseline_eager"], m["baseline_compiled"] = moe_eager, moe_compiled
    for name, b in (("eager", moe_eager), ("compiled", moe_compiled)):
        if b:
            m["speedup_vs_" + name] = {k: round(v / b["decode_tok_s"][k], 2)
                                       for k, v in m.get("decode_tok_s", {}).items()
                                       if b.get("decode_tok_s", {}).get(k)}
    out["moe"] = m
if mixtral and mixtral.get("moe"):
    x = dict(mixtral["moe"])
    x["goals"] = {"decode_tok_s_batch1": ">= 140"}
    out["moe_mixtral"] = x
out.setdefault("complete", bool(moe and (moe.get("moe") or {}).get("complete")))
print(json.dumps(out))
PY
exit "$rc"
