#!/usr/bin/env bash
# scripts/ncu_summary.py over Nsight Compute's CSV as an H100 wrote it (two GEMV launches: the
# q/k/v and the LM head at one row; durations in "ns" with thousands commas), and over a unit it
# does not know.
set -euo pipefail
script=$1
data=$(dirname "$0")/data/ncu_gemv.csv
fail=0
out=$(python3 "$script" "$data")
expect() {  # expect <launch id> <pattern>
  if ! grep -E "^$1 " <<<"$out" | grep -qE -- "$2"; then
    echo "FAIL: launch $1 should match '$2'"; fail=1
  fi
}
expect 0 'grid \(768, 1, 1\) +22\.4 us +50\.4 MB read +2251 GB/s +dram +70\.0% +warps +67\.5%'
expect 16 'grid \(16032, 1, 1\) +336\.2 us +1050\.7 MB read +3125 GB/s +dram +93\.3%'
[ "$(wc -l <<<"$out")" -eq 2 ] || { echo "FAIL: expected 2 launches:"; echo "$out"; fail=1; }
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
sed 's/"ns","22,368"/"fortnight","22,368"/' "$data" >"$tmp"
if bad=$(python3 "$script" "$tmp"); then
  echo "FAIL: an unknown unit was accepted: $bad"; fail=1
elif ! grep -q "fortnight" <<<"$bad"; then
  echo "FAIL: the error does not name the unit: $bad"; fail=1
fi
[ "$fail" -eq 0 ] && echo "ncu_summary_test: all checks passed"
exit $fail
