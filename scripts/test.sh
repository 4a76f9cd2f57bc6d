#!/usr/bin/env bash
# The test suite: installs what is missing, builds, starts throwaway Postgres and Redis on free
# ports in a temporary folder, runs ctest (labels unit, db, gpu, slow; extra args go to ctest),
# stops the services, and exits non-zero on any failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
start=$(date +%s)

scripts/setup.sh
build=${HEADROOM_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "${HEADROOM_JOBS:-2}"
HEADROOM_FUZZ_BUILD_DIR="$build/fuzz" scripts/fuzz.sh 0  # the fuzz targets, for fuzz_smoke

svc=$(mktemp -d /tmp/headroom-test.XXXXXX)
chmod 755 "$svc"
cleanup() { scripts/services.sh stop "$svc" >/dev/null 2>&1 || true; rm -rf "$svc"; }
trap cleanup EXIT
scripts/services.sh start "$svc"
# shellcheck disable=SC1091
source "$svc/env"
export HEADROOM_TEST_DATABASE_URL=$HEADROOM_ADMIN_DATABASE_URL
export HEADROOM_TEST_REDIS_URL=$HEADROOM_REDIS_URL
unset HEADROOM_DATABASE_URL HEADROOM_REDIS_URL HEADROOM_ADMIN_DATABASE_URL

rc=0
ctest --test-dir "$build" --output-on-failure -j "${HEADROOM_TEST_JOBS:-2}" "$@" || rc=$?
echo "test.sh: finished in $(( $(date +%s) - start ))s, exit $rc"
exit $rc
