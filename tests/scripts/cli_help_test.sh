#!/usr/bin/env bash
# Every subcommand's --help lists its options (with their HEADROOM_* environment names).
set -euo pipefail
bin=$1
fail=0
check() {  # check "<args>" "<expected substring>"
  local out
  out=$("$bin" $1 2>&1) || true
  if ! grep -qF -- "$2" <<<"$out"; then
    echo "FAIL: '$bin $1' does not mention '$2'"; echo "$out" | head -20; fail=1
  fi
}
check "--help" "migrate"
check "--help" "--log-format"
for cmd in serve api worker dispatcher migrate; do
  check "$cmd --help" "--database-url"
  check "$cmd --help" "HEADROOM_DATABASE_URL"
done
check "worker --help" "--max-utilization"
check "accounts set --help" "--retention-days"
check "accounts set --help" "--max-enqueued-requests"
check "accounts set --help" "--max-enqueued-tokens"
check "accounts set --help" "--weight"
check "accounts set --help" "--sync-tokens-per-minute"
check "accounts set --help" "--max-concurrent-sync"
check "api --help" "--sync-call-lease-ms"
check "dispatcher --help" "--fair-share"
check "dispatcher --help" "--dispatch-by-prefix"
check "accounts set --help" "--default-priority"
check "accounts set --help" "--operator"
check "serve --help" "--stats-interval-ms"
check "api --help" "--stats-interval-ms"
check "dispatcher --help" "--queue-window-ms"
check "serve --help" "--queue-window-max"
check "accounts show --help" "--account"
check "plan --help" "--gpu-memory"
check "batch --help" "HEADROOM_API_KEY"
check "batch submit --help" "--wait"
# batch's --url and --api-key may follow its subcommand: a connection error, not a usage error.
out=$("$bin" batch list --url http://127.0.0.1:1 --api-key some-key-0123456789 2>&1) && { echo "FAIL: batch list reached nothing"; fail=1; }
grep -q "not expected" <<<"$out" && { echo "FAIL: batch list refused --url after it: $out"; fail=1; }
grep -q "127.0.0.1:1" <<<"$out" || { echo "FAIL: batch list's error does not name the URL: $out"; fail=1; }
check "plan --help" "--expert-weights"
check "dispatcher --help" "--partition-interval-s"
check "serve --help" "--retention-days"
check "serve --help" "--model"
check "version --help" "Usage"
# A bad option value is a clear error, not a crash.
out=$("$bin" --log-format xml version 2>&1) && { echo "FAIL: bad --log-format accepted"; fail=1; }
grep -q "log-format" <<<"$out" || { echo "FAIL: error does not name log-format: $out"; fail=1; }
out=$("$bin" migrate --database-url mysql://x 2>&1) && { echo "FAIL: bad URL accepted"; fail=1; }
grep -q "database-url" <<<"$out" || { echo "FAIL: error does not name database-url: $out"; fail=1; }
# CUDA settings: only with a CUDA device, and only known names and values.
check "worker --help" "--cuda-options"
check "serve --help" "--cuda-options"
out=$(timeout 10 "$bin" serve --model models/x --device cpu --cuda-options fused_rope 2>&1) && { echo "FAIL: --cuda-options accepted on cpu"; fail=1; }
grep -q "cuda-options needs --device cuda" <<<"$out" || { echo "FAIL: not the cpu refusal: $out"; fail=1; }
out=$(timeout 10 "$bin" serve --model models/x --device cuda --cuda-options decode_attention=fast 2>&1) && { echo "FAIL: bad --cuda-options accepted"; fail=1; }
grep -q "cuda-options: decode_attention takes" <<<"$out" || { echo "FAIL: not the bad-value error: $out"; fail=1; }
check "keys revoke --help" "--account"
out=$("$bin" keys revoke 2>&1) && { echo "FAIL: keys revoke with nothing to revoke accepted"; fail=1; }
grep -q "name --key or --account" <<<"$out" || { echo "FAIL: keys revoke's usage error: $out"; fail=1; }
# scripts/run.sh refuses a short HEADROOM_API_KEY before it installs, builds or starts anything.
run_sh=$(cd "$(dirname "$0")/../.." && pwd)/scripts/run.sh
rc=0
out=$(HEADROOM_API_KEY=short-key timeout 10 "$run_sh" 2>&1) || rc=$?
[ $rc -eq 2 ] || { echo "FAIL: run.sh with a 9-character key exited $rc: $out"; fail=1; }
grep -q "HEADROOM_API_KEY must be at least 16 characters (it has 9)" <<<"$out" \
  || { echo "FAIL: run.sh's refusal: $out"; fail=1; }
grep -q "starting" <<<"$out" && { echo "FAIL: run.sh printed its banner first"; fail=1; }
# A subcommand's --database-url wins over HEADROOM_DATABASE_URL (keys and accounts included, whose
# several subcommands each bind one).
for cmd in "keys create --account a" "keys revoke --account a" "accounts show --account a" \
           "accounts set --account a"; do
  out=$(HEADROOM_DATABASE_URL=postgresql://h@127.0.0.1:2/from_env timeout 10 "$bin" $cmd \
        --database-url postgresql://h@127.0.0.1:1/from_flag 2>&1) && { echo "FAIL: $cmd: rc 0"; fail=1; }
  grep -q "port 1" <<<"$out" || { echo "FAIL: $cmd used the environment over its flag: $out"; fail=1; }
done
[ $fail -eq 0 ] && echo "cli_help: ok"
exit $fail
