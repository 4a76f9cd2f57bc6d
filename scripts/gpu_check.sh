#!/usr/bin/env bash
# Verifies the CUDA backend on a machine with a GPU in one command: builds with CUDA, runs every
# `gpu` test (each kernel against its CPU reference, the whole model against the CPU backend and
# PyTorch's reference answers) and the GPU benchmark, and prints a summary. Exits non-zero when a
# test fails or no GPU is visible.
# HEADROOM_PREBUILT=DIR uses test binaries already built in DIR (for a GPU machine without the
# build's packages); the source tree still provides the bundled model and the scripts. Each test's
# full output is kept in HEADROOM_GPU_CHECK_LOGS (default /tmp/headroom-gpu-check).
# Last, `headroom serve --device cuda` end to end (scripts/serve_check.sh), as configured by default
# and with the settings that are still off by default, where Postgres and Redis can run: installed
# here, or packed by scripts/pack_portable.sh and named by HEADROOM_PORTABLE.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export HEADROOM_SOURCE_DIR=$root
if [ -n "${HEADROOM_PREBUILT:-}" ]; then
  bin=$HEADROOM_PREBUILT
else
  scripts/setup.sh >/dev/null || exit 1
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHEADROOM_CUDA=ON >/dev/null || exit 1
  cmake --build build-gpu -j "${HEADROOM_JOBS:-$(nproc)}" \
    --target kernels_device_test cuda_kernels_test cuda_backend_test headroom_gpu_bench || exit 1
  bin=build-gpu/tests
fi
if ! nvidia-smi -L; then
  echo "gpu_check: no GPU visible" >&2
  exit 1
fi
logs=${HEADROOM_GPU_CHECK_LOGS:-/tmp/headroom-gpu-check}
mkdir -p "$logs"
summary=()
failed=0
for t in kernels_device_test cuda_kernels_test cuda_backend_test; do
  echo "== $t"
  start=$(date +%s%N)
  "$bin/$t" --gtest_color=no 2>&1 | tee "$logs/$t.log"
  rc=${PIPESTATUS[0]}
  skipped=$(grep -c '^\[  SKIPPED \]' "$logs/$t.log" || true)
  passed=$(grep -c '^\[       OK \]' "$logs/$t.log" || true)
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  if [ "$rc" -ne 0 ] || [ "$skipped" -ne 0 ]; then failed=1; fi
  summary+=("$(printf '%-22s rc=%d passed=%d skipped=%d %ss' "$t" "$rc" "$passed" "$skipped" "$((ms / 1000)).$((ms % 1000 / 100))")")
done
echo "== bench_gpu"
bench_json=$(HEADROOM_PREBUILT=${HEADROOM_PREBUILT:-$root/build-gpu/tests} scripts/bench_gpu.sh "$@" | tail -1)
bench_rc=$?
echo "$bench_json"
summary+=("$(printf '%-22s rc=%d %s' bench_gpu "$bench_rc" "$(python3 -c '
import json, sys
try:
    b = json.loads(sys.argv[1])
    print("batch1_mbu=%.3f best=%s" % (b["batch1_mbu"], json.dumps(b.get("best_batch1_mbu"))))
except Exception as e:
    print("no JSON:", e)' "$bench_json")")")
echo "== serve_check (headroom serve --device cuda)"
if [ -n "${HEADROOM_PORTABLE:-}" ] || { [ -z "${HEADROOM_PREBUILT:-}" ] && [ -x /usr/lib/postgresql/15/bin/postgres ]; }; then
  # As configured by default, then with the settings still off by default (--cuda-options).
  for options in "" "fused_rope,fused_combine,decode_attention=tensor_core"; do
    name=serve_check${options:+_options}
    HEADROOM_CUDA_OPTIONS=$options scripts/serve_check.sh cuda 2>&1 | tee "$logs/$name.log"
    serve_rc=${PIPESTATUS[0]}
    [ "$serve_rc" -eq 0 ] || failed=1
    summary+=("$(printf '%-22s rc=%d %s' "$name" "$serve_rc" "$(tail -1 "$logs/$name.log")")")
  done
else
  summary+=("serve_check            skipped: no Postgres/Redis here (HEADROOM_PORTABLE: scripts/pack_portable.sh)")
fi
echo "== gpu_check summary"
for line in "${summary[@]}"; do echo "$line"; done
[ "$bench_rc" -eq 0 ] || failed=1
echo "$bench_json"
exit $failed
