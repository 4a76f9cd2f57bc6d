#!/usr/bin/env bash
# Runs the product on this machine: installs what is missing, builds (Release), starts Postgres and
# Redis under .headroom/ in the checkout, applies migrations and starts `headroom serve` with the
# bundled model. Ctrl-C stops everything it started. HEADROOM_PORT picks the HTTP port (8080).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

scripts/setup.sh
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j "${HEADROOM_JOBS:-2}"

scripts/services.sh start "$root/.headroom"
# shellcheck disable=SC1091
source "$root/.headroom/env"
stop_all() { scripts/services.sh stop "$root/.headroom" >/dev/null 2>&1 || true; }
trap stop_all EXIT
trap 'exit 130' INT TERM

build-release/headroom migrate
port=${HEADROOM_PORT:-8080}
export HEADROOM_PORT=$port
echo
echo "Headroom is starting on http://127.0.0.1:$port (Ctrl-C stops it and its services)"
build-release/headroom serve --model "$root/models/tiny-reverse" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; exit 130' INT TERM
wait $pid
