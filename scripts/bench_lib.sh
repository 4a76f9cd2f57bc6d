# Shared by the queue-side benchmarks (sourced, not run): builds the release binaries named in
# $bench_targets (in $build), starts a private Postgres and Redis in a temporary folder (stopped on exit,
# together with every pid in $pids), applies the migrations, and sets $bin (the headroom binary)
# and $port (a free port). Helpers: bench_key ACCOUNT, bench_wait_ready PORT.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# HEADROOM_BENCH_BUILD=DIR: an existing build folder instead, built as it is configured, or a
# folder of binaries alone (headroom, tests/...) used as they are: comparisons of two versions.
# HEADROOM_PORTABLE=FILE (scripts/pack_portable.sh): headroom, Postgres and Redis from the pack,
# nothing installed or built (a GPU machine without the project's packages; the benchmark's own
# binaries then come from HEADROOM_BENCH_BUILD).
build=${HEADROOM_BENCH_BUILD:-build-release}
svc=$(mktemp -d /tmp/headroom-bench.XXXXXX)
chmod 755 "$svc"
pids=()
bench_cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/services.sh stop "$svc" >/dev/null 2>&1 || true
  rm -rf "$svc"
}
trap bench_cleanup EXIT
if [ -n "${HEADROOM_PORTABLE:-}" ]; then
  # shellcheck source=scripts/portable_lib.sh
  source scripts/portable_lib.sh
  portable_unpack "$HEADROOM_PORTABLE" "$svc/portable"
else
  scripts/setup.sh >/dev/null
  if [ -z "${HEADROOM_BENCH_BUILD:-}" ]; then
    cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  if [ -f "$build/build.ninja" ]; then
    # shellcheck disable=SC2086
    cmake --build "$build" -j "${HEADROOM_JOBS:-2}" --target headroom $bench_targets >/dev/null
  fi
fi
scripts/services.sh start "$svc" >/dev/null
# shellcheck disable=SC1091
source "$svc/env"
bin=${portable_headroom:-$build/headroom}
# HEADROOM_BENCH_MIGRATIONS: a folder of migrations to apply instead of the built-in ones (the
# schema of an earlier version, to compare with).
$bin --log-level warn migrate ${HEADROOM_BENCH_MIGRATIONS:+--migrations-dir "$HEADROOM_BENCH_MIGRATIONS"}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

bench_key() { $bin keys create --account "$1" 2>/dev/null; }
bench_wait_ready() {
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$1/readyz" >/dev/null && return 0
    sleep 0.1
  done
  return 1
}
