#!/usr/bin/env bash
# The dashboard in a real browser: starts private Postgres and Redis and `headroom serve` on the
# bundled model (its key's account an operator's, a second account's key not), then drives
# Debian's Chromium headless with playwright-core (tests/node/dashboard.cjs). Screenshots go to
# ${TMPDIR:-/tmp}/headroom-dashboard/. Afterwards, `headroom accounts set --operator true` makes
# the second account an operator's, checked on the route.
# Usage: dashboard_test.sh HEADROOM_BINARY SOURCE_DIR NPM_PREFIX
set -euo pipefail
bin=$1
src=$2
prefix=$(realpath -m "$3")
chromium=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$chromium" ]; then
  echo "dashboard_test: $chromium is missing (scripts/setup.sh installs Debian's chromium)" >&2
  exit 1
fi
svc=$(mktemp -d /tmp/hr-dashboard.XXXXXX)
chmod 755 "$svc"
pid=
cleanup() {
  [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  "$src/scripts/services.sh" stop "$svc" >/dev/null 2>&1 || true
  rm -rf "$svc"
}
trap cleanup EXIT
"$src/scripts/services.sh" start "$svc" >/dev/null
# shellcheck disable=SC1091
source "$svc/env"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
key=dashboard-check-key-0123456789
HEADROOM_API_KEY=$key "$bin" --log-level error serve --model "$src/models/tiny-reverse" \
  --port "$port" --stats-interval-ms 500 >"$svc/serve.log" 2>&1 &
pid=$!
u=http://127.0.0.1:$port
for _ in $(seq 1 100); do curl -sf "$u/readyz" >/dev/null && break; sleep 0.2; done
other=$("$bin" keys create --account other | tail -1)
"$src/tests/scripts/npm_prefix.sh" "$prefix" playwright-core@1.65.1
shots=${TMPDIR:-/tmp}/headroom-dashboard
mkdir -p "$shots"
CHROMIUM=$chromium node "$src/tests/node/dashboard.cjs" "$prefix/node_modules" "$u" "$key" "$other" "$shots" ||
  { echo "dashboard_test: failed; the server's log:" >&2; tail -20 "$svc/serve.log" >&2; exit 1; }
# The CLI grants the operator's view; the route agrees at once.
code=$(curl -s -o /dev/null -w '%{http_code}' "$u/v1/operator/stats" -H "Authorization: Bearer $other")
[ "$code" = 403 ] || { echo "dashboard_test: a tenant's key read the operator's view ($code)" >&2; exit 1; }
"$bin" accounts set --account other --operator true | grep -q '"operator": true'
code=$(curl -s -o /dev/null -w '%{http_code}' "$u/v1/operator/stats" -H "Authorization: Bearer $other")
[ "$code" = 200 ] || { echo "dashboard_test: accounts set --operator true did not take ($code)" >&2; exit 1; }
echo "dashboard_test: ok (screenshots in $shots)"
