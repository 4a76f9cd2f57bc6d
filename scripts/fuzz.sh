#!/usr/bin/env bash
# Fuzzes the parsers that read what clients and files send (tests/fuzz/: the HTTP server, the
# Workers-AI body and OpenAI batch lines, multipart forms, URLs and IP ranges, the tokenizer,
# safetensors headers, the Jinja interpreter and the JSON-schema compiler) with libFuzzer under
# AddressSanitizer and UndefinedBehaviorSanitizer.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     SECONDS per target (default 60); all targets by default
#                                             (0: only build them)
#
# Builds tests/fuzz with clang++-14 in ${HEADROOM_FUZZ_BUILD_DIR:-build-fuzz}. Each target starts
# from the seeds committed in tests/fuzz/corpus/TARGET (inputs that once crashed stay there as
# regression tests; the chat templates of tests/data seed the interpreter) and grows a working
# corpus under the build folder. A crash leaves its input in BUILD/artifacts/TARGET/. Prints a
# line per target (executions, coverage, corpus, crashes) and, last, one JSON object; exits 1 if
# any target crashed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

seconds=60
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
  seconds=$1
  shift
fi
all=(http_request workers_ai_body openai_batch_line multipart url_ip tokenizer safetensors jinja
  json_schema)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")

build=${HEADROOM_FUZZ_BUILD_DIR:-build-fuzz}
command -v clang++-14 >/dev/null || { echo "fuzz.sh: clang++-14 is missing (scripts/setup.sh)" >&2; exit 1; }
cmake -S tests/fuzz -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang-14 \
  -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null
# Quiet when it builds; the compiler's and linker's errors when it does not.
if ! out=$(cmake --build "$build" -j "${HEADROOM_JOBS:-2}" -- $(printf '%s_fuzz ' "${targets[@]}") 2>&1); then
  grep -v '^\[[0-9]*/[0-9]*\]' <<<"$out" >&2
  echo "fuzz.sh: building the fuzz targets failed" >&2
  exit 1
fi

[[ $seconds -gt 0 ]] || exit 0
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
json="{\"seconds_per_target\": $seconds, \"targets\": {"
total_crashes=0
sep=""
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  artifacts="$build/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  seeds=("tests/fuzz/corpus/$t")
  [[ $t == jinja ]] && seeds+=(tests/data/chat_templates)
  max_len=8192
  timeout=10
  case $t in
    jinja) max_len=32768 timeout=60 ;;  # a render may run 1,000,000 steps (slow under ASan)
    http_request | openai_batch_line | workers_ai_body) max_len=16384 ;;
  esac
  log="$build/$t.log"
  touch "$log.start"
  rc=0
  "$build/${t}_fuzz" "$corpus" "${seeds[@]}" -max_total_time="$seconds" -max_len="$max_len" \
    -timeout="$timeout" -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" \
    >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE ' cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
  ft=$(grep -oE ' ft: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
  units=$(find "$corpus" -type f | wc -l)
  crashes=$(find "$artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
    -o -name 'oom-*' \) -newer "$log.start" 2>/dev/null | wc -l || true)
  [[ $rc -ne 0 && $crashes -eq 0 ]] && crashes=1  # it stopped on something (see the log)
  total_crashes=$((total_crashes + crashes))
  printf 'fuzz %-18s execs %-10s cov %-6s ft %-6s corpus %-6s crashes %s%s\n' "$t" "${execs:-0}" \
    "${cov:-0}" "${ft:-0}" "$units" "$crashes" "$([[ $crashes -gt 0 ]] && echo "  (log: $log)")"
  json+="$sep\"$t\": {\"execs\": ${execs:-0}, \"cov\": ${cov:-0}, \"ft\": ${ft:-0}, \"corpus\": $units, \"crashes\": $crashes}"
  sep=", "
done
json+="}, \"crashes\": $total_crashes}"
echo "$json"
[[ $total_crashes -eq 0 ]]
