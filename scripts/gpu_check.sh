#!/usr/bin/env bash
# Verifies the CUDA backend on a machine with a GPU in one command: builds with CUDA, runs every
# `gpu` test (each kernel against its CPU reference, the whole model against the CPU backend and
# PyTorch's reference answers), the GPU benchmark, `headroom serve --device cuda` end to end, and
# the kernel tests under compute-sanitizer, and prints a summary. Exits non-zero when a stage
# fails, runs out of time, or no GPU is visible.
#   scripts/gpu_check.sh [bench_gpu.sh arguments...]
# HEADROOM_GPU_CHECK_STAGES   which stages, in this order (default fixtures,tests,bench,serve,sanitize)
#   fixtures  scripts/make_fixtures.py for each folder of models/fixtures that is missing (its
#             reference.json), with the machine's transformers; they are left there to be committed
#   tests     kernels_device_test, cuda_kernels_test, cuda_moe_test, cuda_sampling_test,
#             cuda_backend_test, cuda_fixture_models_test, cuda_collectives_test,
#             cuda_peer_collectives_test, cuda_parallel_test; a skip counts as a failure (one GPU a
#             rank's cases of cuda_parallel_test are left out on a machine of fewer than 4 GPUs,
#             and cuda_moe_test's experts on every device on a machine of one)
#   bench     scripts/bench_gpu.sh (our engine, then Hugging Face transformers as the baseline; with
#             structured output's decode rate against free decoding at batch 1 and 64; then the
#             MoE section, Qwen3-30B-A3B against transformers eager and compiled)
#   serve     scripts/serve_check.sh cuda, as configured by default and with the paths the
#             defaults leave unused (--cuda-options), where Postgres and Redis can run: installed here, or
#             packed by scripts/pack_portable.sh and named by HEADROOM_PORTABLE
#   slice     (only when named) scripts/bench_rank_slice.sh: a Llama-3.3-70B TP4 and TP8 rank's
#             decode steps, the all-reduce microbenchmark, the projected deployment step
#             (slice.json beside the logs)
#   flex      (only when named) scripts/bench_flex.sh on the Llama-3-8B shape (random weights written
#             on first use, served with --device cuda): sync p99 TTFT with an async backlog over
#             without, and async tokens against what sync leaves (flex.json beside the logs);
#             HEADROOM_FLEX_PHASE_SECONDS each phase (20); needs Postgres and Redis as serve does;
#             the server's log and the chart are copied beside the logs
#   load      (only when named) headroom_cuda_load_bench on the Llama-3-8B shape's random checkpoint
#             (16 GB, written as the flex stage writes it when the folder is missing;
#             HEADROOM_LOAD_MODEL names another): its cold load to the GPU by one rank and by 2 and 4 virtual ranks
#             against reading the files (load.json)
#   profile   (only when named) Nsight Compute over the GEMV kernel at every decode shape, one and
#             two rows: duration, DRAM throughput and the bandwidth it reached, per launch; and over
#             batch-1 decode steps of the Qwen3-30B-A3B shape cut to 4 layers (graphs replayed,
#             each kernel node timed): the last step launch by launch, and each kernel per step
#   sanitize  compute-sanitizer: memcheck over the kernel tests and the backend's logits test,
#             racecheck and synccheck over the attention and GEMV tests (a check not started for
#             lack of time is reported, and does not fail the run)
# HEADROOM_GPU_CHECK_DEADLINE_S  the run's time limit after the build (default 570): each stage gets what is
#   left (less a reserve for the summary) and is stopped there; a stage with under 20 s left is not
#   started. The summary is printed whatever happened.
# HEADROOM_PREBUILT=DIR uses test binaries already built in DIR (scripts/gpu_prepare.sh makes them,
# for a GPU machine without the build's packages); the source tree still provides the bundled
# model and the scripts.
# HEADROOM_GPU_CHECK_LOGS  where each stage's full output goes (default /tmp/headroom-gpu-check),
#   with summary.txt and the benchmark's JSON (bench.json) beside them.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export HEADROOM_SOURCE_DIR=$root
stages=${HEADROOM_GPU_CHECK_STAGES:-fixtures,tests,bench,serve,sanitize}
logs=${HEADROOM_GPU_CHECK_LOGS:-/tmp/headroom-gpu-check}
mkdir -p "$logs"

for stage in ${stages//,/ }; do
  case $stage in fixtures | tests | bench | slice | serve | flex | load | sanitize | profile) ;;
    *) echo "gpu_check: unknown stage '$stage' in HEADROOM_GPU_CHECK_STAGES (fixtures, tests, bench, slice, serve, flex, load, sanitize, profile)" >&2
       exit 2 ;;
  esac
done
wants() { [[ ",$stages," == *",$1,"* ]]; }

if [ -n "${HEADROOM_PREBUILT:-}" ]; then
  bin=$HEADROOM_PREBUILT
else
  scripts/setup.sh >/dev/null || exit 1
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHEADROOM_CUDA=ON >/dev/null || exit 1
  cmake --build build-gpu -j "${HEADROOM_JOBS:-$(nproc)}" \
    --target kernels_device_test cuda_kernels_test cuda_moe_test cuda_sampling_test cuda_backend_test \
    cuda_fixture_models_test cuda_collectives_test cuda_peer_collectives_test cuda_parallel_test \
    headroom_gpu_bench headroom_allreduce_bench headroom_cuda_load_bench headroom_engine_bench || exit 1
  bin=$root/build-gpu/tests
fi
# The binaries (and the packed headroom) load the CUDA runtime and cuBLASLt from where the build
# found them; on another machine they may be elsewhere (lib64, targets/, Python's nvidia
# packages): each one missing is looked for once and its folder put on the library path.
for lib in $(ldd "$bin/cuda_kernels_test" 2>/dev/null | awk '/not found/ {print $1}' | sort -u); do
  found=
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    if [ -e "$d/$lib" ]; then found=$d/$lib; break; fi
  done
  [ -n "$found" ] || found=$(find /usr /opt -name "$lib" -print -quit 2>/dev/null || true)
  if [ -z "$found" ]; then
    echo "gpu_check: $lib (needed by the test binaries) is nowhere under /usr or /opt" >&2
    exit 1
  fi
  echo "gpu_check: $lib from $(dirname "$found")"
  export LD_LIBRARY_PATH=$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
# NCCL is loaded with dlopen (engine/nccl_communicator.h), so ldd does not name it: when the
# loader does not know it, it is looked for the same way (Python's nvidia packages have one).
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
  nccl=
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    if [ -e "$d/libnccl.so.2" ]; then nccl=$d/libnccl.so.2; break; fi
  done
  [ -n "$nccl" ] || nccl=$(find /usr /opt -name libnccl.so.2 -print -quit 2>/dev/null || true)
  if [ -n "$nccl" ]; then
    echo "gpu_check: libnccl.so.2 from $(dirname "$nccl")"
    export LD_LIBRARY_PATH=$(dirname "$nccl")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
fi
if ! nvidia-smi -L; then
  echo "gpu_check: no GPU visible" >&2
  exit 1
fi
# The deadline counts from here: a build before is not part of it.
begin=$(date +%s)
deadline=$(( begin + ${HEADROOM_GPU_CHECK_DEADLINE_S:-570} ))

summary=()
failed=0
bench_json=
print_summary() {
  echo "== gpu_check summary ($(( $(date +%s) - begin ))s; logs in $logs)"
  for line in ${summary[@]+"${summary[@]}"}; do echo "$line"; done
  [ -n "$bench_json" ] && echo "$bench_json"
}
stop_stage() {
  [ -f "$logs/.stage_pid" ] && kill -TERM "$(cat "$logs/.stage_pid")" 2>/dev/null
  note "gpu_check interrupted"
  print_summary
  exit 130
}
trap stop_stage INT TERM
note() { summary+=("$1"); printf '%s\n' "$1" >>"$logs/summary.txt"; }
: >"$logs/summary.txt"

# Seconds a stage may run: what is left before the deadline, less 10 s for the summary, at most $1.
budget() {
  local left=$(( deadline - $(date +%s) - 10 ))
  [ "$left" -gt "$1" ] && left=$1
  echo "$left"
}
# run_stage NAME LOG CAP CMD...: runs CMD with its output in LOG (and on the terminal) under the
# time left; sets stage_rc (124 when stopped for time, 125 when not started) and stage_s.
run_stage() {
  local name=$1 log=$2 cap=$3
  shift 3
  local secs
  secs=$(budget "$cap")
  stage_s=0
  if [ "$secs" -lt 20 ]; then
    echo "== $name: not started, ${secs}s left before the deadline" | tee "$log"
    stage_rc=125
    return
  fi
  echo "== $name (at most ${secs}s)"
  local t0
  t0=$(date +%s)
  # timeout runs the stage in a process group of its own: an interrupt of this script reaches it
  # through the trap below, which runs at once because this shell waits with the wait builtin.
  rm -f "$logs/.stage_rc"
  {
    timeout --kill-after=10 "$secs" "$@" 2>&1 &
    echo $! >"$logs/.stage_pid"
    wait $!
    echo $? >"$logs/.stage_rc"
  } | tee "$log" &
  wait $!
  stage_rc=$(cat "$logs/.stage_rc" 2>/dev/null || echo 1)
  rm -f "$logs/.stage_pid" "$logs/.stage_rc"
  stage_s=$(( $(date +%s) - t0 ))
  # Killed after the TERM at the limit: out of time too (not when killed sooner, for memory say).
  [ "$stage_rc" -eq 137 ] && [ "$stage_s" -ge "$secs" ] && stage_rc=124
}
outcome() {  # a stage's rc in words
  case $1 in 0) echo "ok" ;; 124) echo "STOPPED: out of time" ;; 125) echo "NOT RUN: out of time" ;; *) echo "FAILED rc=$1" ;; esac
}

if wants fixtures; then
  missing=()
  for f in qwen3 qwen3-moe qwen3-moe-step2 mixtral qwen3-moe-fused; do
    [ -f "models/fixtures/$f/reference.json" ] || missing+=("$f")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    note "$(printf '%-32s %s' fixtures 'ok: all present')"
  else
    # (the fused form is written with the model it holds)
    only=$(printf '%s\n' "${missing[@]}" | sed 's/-fused$//' | sort -u | paste -sd,)
    run_stage fixtures "$logs/fixtures.log" 120 env PYTHONUNBUFFERED=1 python3 scripts/make_fixtures.py --only "$only"
    [ "$stage_rc" -eq 0 ] || failed=1
    note "$(printf '%-32s %s %ss made: %s' fixtures "$(outcome "$stage_rc")" "$stage_s" "$only")"
  fi
fi

if wants tests; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  for t in kernels_device_test cuda_kernels_test cuda_moe_test cuda_sampling_test cuda_backend_test \
    cuda_fixture_models_test cuda_collectives_test cuda_peer_collectives_test cuda_parallel_test; do
    filter=()
    if [ "$t" = cuda_parallel_test ] && [ "$gpus" -lt 4 ]; then filter=(--gtest_filter=-*CudaPeerRanks*); fi
    if [ "$t" = cuda_moe_test ] && [ "$gpus" -lt 2 ]; then filter=(--gtest_filter=-*OnEveryDevice*); fi
    run_stage "$t" "$logs/$t.log" 300 "$bin/$t" --gtest_color=no "${filter[@]}"
    # (gtest lists each skipped test again at the end: counted once)
    skipped=$(grep '^\[  SKIPPED \] [A-Za-z]' "$logs/$t.log" | awk '{print $4}' | sort -u | grep -c .)
    passed=$(grep -c '^\[       OK \]' "$logs/$t.log")
    failures=$(grep '^\[  FAILED  \] [A-Za-z]' "$logs/$t.log" | grep -v ' tests\?, listed below' | awk '{print $4}' | sort -u | tr '\n' ' ')
    if [ "$stage_rc" -ne 0 ] || [ "$skipped" -ne 0 ]; then failed=1; fi
    note "$(printf '%-32s %s passed=%d skipped=%d %ss %s' "$t" "$(outcome "$stage_rc")" "$passed" "$skipped" "$stage_s" "$failures")"
  done
fi

if wants bench; then
  run_stage bench_gpu "$logs/bench.log" 900 \
    env HEADROOM_PREBUILT="$bin" scripts/bench_gpu.sh "$@"
  # The last figures printed: the merged line, or the engine's own if the stage was cut short
  # (both say whether they are "complete"; the baseline's own line does not).
  bench_json=$(grep '^{' "$logs/bench.log" | grep '"complete"' | tail -1)
  if python3 -c 'import json, sys; json.loads(sys.argv[1])' "$bench_json" 2>/dev/null; then
    echo "$bench_json" >"$logs/bench.json"
  else
    bench_json=
  fi
  [ "$stage_rc" -eq 0 ] || failed=1
  note "$(printf '%-32s %s %ss %s' bench_gpu "$(outcome "$stage_rc")" "$stage_s" "$(python3 -c '
import json, sys
try:
    b = json.loads(sys.argv[1])
    base = b.get("baseline") or {}
    mbu = b.get("batch1_mbu")
    structured = {k: v.get("constrained_over_free") for k, v in (b.get("structured_output") or {}).items()}
    print("batch1_mbu=%s best=%s decode_tok_s=%s prefill_tok_s=%s structured_over_free=%s complete=%s errors=%s baseline: %s" % (
        "%.3f" % mbu if isinstance(mbu, (int, float)) else mbu, json.dumps(b.get("best_batch1_mbu")), json.dumps(b.get("decode_tok_s")),
        b.get("prefill_tok_s"), json.dumps(structured), b.get("complete"), len(b.get("errors") or {}),
        json.dumps({k: base.get(k) for k in ("decode_tok_s", "prefill_tok_s")}) if base else "none"))
except Exception as e:
    print("no JSON:", e)' "$bench_json")")"
fi

if wants slice; then
  run_stage rank_slice "$logs/slice.log" 600 env HEADROOM_PREBUILT="$bin" scripts/bench_rank_slice.sh
  slice_json=$(grep '^{"allreduce"' "$logs/slice.log" | tail -1)
  [ -n "$slice_json" ] && echo "$slice_json" >"$logs/slice.json"
  [ "$stage_rc" -eq 0 ] || failed=1
  note "$(printf '%-32s %s %ss %s' rank_slice "$(outcome "$stage_rc")" "$stage_s" "$(python3 -c '
import json, sys
try:
    s = json.loads(sys.argv[1])["slices"]
    print(" ".join("%s: %s" % (k, {b: (r["slice_tok_s"], (r["projected"].get("sglang_anchor") or {}).get("tok_s")) for b, r in (v or {}).get("decode", {}).items()}) for k, v in s.items()))
except Exception as e:
    print("no JSON:", e)' "$slice_json")")"
fi

if wants serve; then
  if [ -n "${HEADROOM_PORTABLE:-}" ] || { [ -z "${HEADROOM_PREBUILT:-}" ] && [ -x /usr/lib/postgresql/15/bin/postgres ]; }; then
    # As configured by default, then with the paths the defaults leave unused (--cuda-options):
    # RoPE and the split merge in kernels of their own, decode attention in prefill tiles, and the
    # next weights prefetched.
    for options in "" "fused_rope=off,fused_combine=off,decode_attention=prefill_tiles,prefetch_weights"; do
      name=serve_check${options:+_options}
      run_stage "$name" "$logs/$name.log" 150 env HEADROOM_CUDA_OPTIONS="$options" scripts/serve_check.sh cuda
      [ "$stage_rc" -eq 0 ] || failed=1
      note "$(printf '%-32s %s %ss %s' "$name" "$(outcome "$stage_rc")" "$stage_s" "$(grep '^{' "$logs/$name.log" | tail -1)")"
    done
  else
    note "serve_check                      skipped: no Postgres/Redis here (HEADROOM_PORTABLE: scripts/pack_portable.sh)"
  fi
fi

if wants flex; then
  # The prepared binaries with the portable pack, or this machine's packages and build-gpu (the
  # benchmark's targets built on top of the tests').
  flex_env=()
  if [ -n "${HEADROOM_PREBUILT:-}" ] && [ -n "${HEADROOM_PORTABLE:-}" ]; then
    flex_env=(HEADROOM_BENCH_BUILD="$HEADROOM_PREBUILT")
  elif [ -z "${HEADROOM_PREBUILT:-}" ] && [ -x /usr/lib/postgresql/15/bin/postgres ]; then
    flex_env=(HEADROOM_BENCH_BUILD="$root/build-gpu" HEADROOM_PORTABLE=)
  fi
  if [ ${#flex_env[@]} -gt 0 ]; then
    rm -f "$root/.headroom/bench-flex/llama8b-serve.log" "$root/.headroom/bench-flex/llama8b.png"
    run_stage flex "$logs/flex.log" 540 env HEADROOM_FLEX_MODELS=llama8b HEADROOM_JOBS="${HEADROOM_JOBS:-$(nproc)}" \
      HEADROOM_BENCH_PHASE_SECONDS="${HEADROOM_FLEX_PHASE_SECONDS:-20}" "${flex_env[@]}" scripts/bench_flex.sh
    flex_json=$(grep '^{' "$logs/flex.log" | tail -1)
    [ -n "$flex_json" ] && echo "$flex_json" >"$logs/flex.json"
    # The server's own log (its steps and the worker's pulls) and the chart, beside the others.
    cp "$root/.headroom/bench-flex/llama8b-serve.log" "$root/.headroom/bench-flex/llama8b.png" \
      "$logs/" 2>/dev/null
    [ "$stage_rc" -eq 0 ] || failed=1
    note "$(printf '%-32s %s %ss %s' flex "$(outcome "$stage_rc")" "$stage_s" "$(python3 -c '
import json, sys
try:
    print(json.dumps(json.loads(sys.argv[1]).get("gpu")))
except Exception as e:
    print("no JSON:", e)' "$flex_json")")"
  else
    note "flex                             skipped: no Postgres/Redis here (HEADROOM_PREBUILT and HEADROOM_PORTABLE: scripts/gpu_prepare.sh)"
  fi
fi

if wants load; then
  model=${HEADROOM_LOAD_MODEL:-$root/.headroom/bench-model-llama3-8b-text}
  if [ ! -e "$model" ]; then
    # (Written to a side folder, moved into place when whole, as bench_flex.sh does; a folder
    # that is there is never written into.)
    run_stage load_model "$logs/load_model.log" 240 bash -c 'rm -rf "$1.partial" &&
      "$2" --make-random-model "$1.partial" --tokenizer-from models/tiny-reverse \
        --output-vocab printable --shape llama3-8b && mv "$1.partial" "$1"' _ "$model" \
      "$bin/headroom_engine_bench"
    [ "$stage_rc" -eq 0 ] || failed=1
    note "$(printf '%-32s %s %ss' load_model "$(outcome "$stage_rc")" "$stage_s")"
  fi
  run_stage load "$logs/load.log" 300 "$bin/headroom_cuda_load_bench" --model "$model" --rounds 2
  load_json=$(grep '^{' "$logs/load.log" | tail -1)
  [ -n "$load_json" ] && echo "$load_json" >"$logs/load.json"
  [ "$stage_rc" -eq 0 ] || failed=1
  note "$(printf '%-32s %s %ss %s' load "$(outcome "$stage_rc")" "$stage_s" "$(python3 -c '
import json, sys
try:
    j = json.loads(sys.argv[1])
    print("disk %.2f GB/s; over disk: %s" % (j["disk_cold_read_gbs"], json.dumps({k: round(v, 2) for k, v in j.get("over_disk", {}).items()})))
except Exception as e:
    print("no JSON:", e)' "$load_json")")"
fi

if wants sanitize; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ ! -x "$sanitizer" ]; then
    failed=1
    note "sanitize                         FAILED: no compute-sanitizer here"
  else
    # tool, binary, test filter: memcheck over every kernel test and the whole model's logits (graphs,
    # pipelined steps, the fewer-kernel settings); racecheck and synccheck (shared memory and
    # barriers) over the attention and GEMV kernels, then the sampling kernel.
    for check in "memcheck cuda_kernels_test *" \
                 "memcheck cuda_moe_test *" \
                 "racecheck cuda_moe_test *" \
                 "memcheck cuda_backend_test *LogitsMatchCpuBackend*:*FedTokensEqualKnownTokens*" \
                 "racecheck cuda_kernels_test *PagedAttention*:*Gemv*" \
                 "synccheck cuda_kernels_test *PagedAttention*:*Gemv*" \
                 "memcheck cuda_sampling_test *" \
                 "racecheck cuda_sampling_test *Logprobs*:*Penalties*" \
                 "synccheck cuda_sampling_test *Logprobs*:*Penalties*"; do
      read -r tool t filter <<<"$check"
      name=sanitize_${tool}_${t%_test}
      # Memory errors only: a library's own failed API calls (cuBLASLt probing) are not ours.
      extra=()
      [ "$tool" = memcheck ] && extra=(--report-api-errors no)
      run_stage "$name" "$logs/$name.log" 240 "$sanitizer" --tool "$tool" ${extra[@]+"${extra[@]}"} --error-exitcode 3 \
        "$bin/$t" --gtest_color=no "--gtest_filter=$filter"
      # A check left out for time is reported as such; it fails the run only if it ran and failed.
      [ "$stage_rc" -eq 0 ] || [ "$stage_rc" -eq 125 ] || failed=1
      note "$(printf '%-32s %s %ss %s' "$name" "$(outcome "$stage_rc")" "$stage_s" \
        "$(grep -E '^========= (ERROR SUMMARY|RACECHECK SUMMARY)' "$logs/$name.log" | tail -1 | sed 's/^========= //')")"
    done
  fi
fi

if wants profile; then
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  if [ ! -x "$ncu" ]; then
    failed=1
    note "profile_gemv                     FAILED: no ncu here"
  else
    # Clocks as they are (the bandwidth is what is asked); the warm-up launches are in the CSV too.
    run_stage profile_gemv "$logs/profile_gemv.csv" 240 "$ncu" --clock-control none \
      --kernel-name regex:gemv_kernel --csv \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size \
      "$bin/headroom_gpu_bench" --gemv-profile 1
    [ "$stage_rc" -eq 0 ] || failed=1
    note "$(printf '%-32s %s %ss' profile_gemv "$(outcome "$stage_rc")" "$stage_s")"
    if [ "$stage_rc" -ne 125 ]; then
      # No launch in the CSV (no profiling permission, say) is a failure too.
      python3 "$root/scripts/ncu_summary.py" "$logs/profile_gemv.csv" >"$logs/profile_gemv.txt" 2>&1 || failed=1
      while IFS= read -r line; do note "  $line"; done <"$logs/profile_gemv.txt"
    fi
    run_stage profile_moe "$logs/profile_moe.csv" 240 "$ncu" --clock-control none --csv \
      --graph-profiling node \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size \
      "$bin/headroom_gpu_bench" --moe qwen3-30b-a3b --moe-layers 4 --moe-decode-only 1 \
      --batches 1 --steps 6 --prompt 128 --max-seqs 8 --copy-mb 256
    [ "$stage_rc" -eq 0 ] || failed=1
    note "$(printf '%-32s %s %ss' profile_moe "$(outcome "$stage_rc")" "$stage_s")"
    if [ "$stage_rc" -ne 125 ]; then
      python3 "$root/scripts/ncu_summary.py" --steps 3 "$logs/profile_moe.csv" >"$logs/profile_moe.txt" 2>&1 || failed=1
      while IFS= read -r line; do note "  $line"; done <"$logs/profile_moe.txt"
    fi
  fi
fi

print_summary
exit $failed
