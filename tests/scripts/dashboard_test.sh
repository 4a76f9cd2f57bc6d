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
key=dashboard-check-key-0123456789
# shellcheck source=tests/scripts/serve_stack.sh
source "$src/tests/scripts/serve_stack.sh"
serve_stack "$bin" "$src" "$key" --stats-interval-ms 500
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
